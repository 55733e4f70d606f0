//! The shared broker state: sessions, the subscription index, retained messages, services.
//!
//! Lock order, everywhere: the session map, then the subscription index, then a session's own
//! state. Routing a publish takes only the index (shared) and the receiving sessions' own locks,
//! so publishers on different connections proceed in parallel.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{Authenticator, DefaultAuthenticator, PasswordStore};
use crate::config::BrokerConfig;
use crate::inner::Inner;
use crate::placement::ConnThreads;
use crate::service::{OutboundMessage, Service};
use crate::session::{Delivery, Enqueued, Message};
use crate::transport::Transport;

/// A running broker. Cheap to clone; every clone is the same broker.
#[derive(Clone)]
pub struct Broker {
    pub(crate) inner: Arc<Inner>,
}

impl Broker {
    /// A broker with the default authenticator built from `config`. Must be called inside a
    /// Tokio runtime: it starts the session-expiry and will-delay timer there. It also starts
    /// the threads that serve connections; that can fail like any thread or runtime start.
    pub fn new(config: BrokerConfig) -> std::io::Result<Broker> {
        Broker::with_passwords(config, Arc::new(PasswordStore::default()))
    }

    /// A broker like [`Broker::new`] whose clients may log in as the users of `passwords`
    /// (which the caller may replace while the broker runs).
    pub fn with_passwords(
        config: BrokerConfig,
        passwords: Arc<PasswordStore>,
    ) -> std::io::Result<Broker> {
        let auth = DefaultAuthenticator {
            allow_anonymous: config.allow_anonymous,
            passwords,
            certificate_attributes: Vec::new(),
            tokens: Arc::default(),
        };
        Broker::with_authenticator(config, Arc::new(auth))
    }

    /// A broker like [`Broker::new`] with an authenticator of the caller's.
    pub fn with_authenticator(
        config: BrokerConfig,
        auth: Arc<dyn Authenticator>,
    ) -> std::io::Result<Broker> {
        let threads = ConnThreads::start(
            config.threads(),
            config.pin_connection_threads,
            config.batch_connection_threads,
        )?;
        let broker = Broker {
            inner: Arc::new(Inner::new(config, auth, threads)),
        };
        let weak = Arc::downgrade(&broker.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                inner.sweep(Instant::now());
            }
        });
        Ok(broker)
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    /// Binds a TCP listener and serves MQTT on it until shutdown. Returns the bound address.
    /// Up to four connection threads accept from it.
    pub async fn listen(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        self.listen_on(addr, Transport::Tcp).await
    }

    /// Binds a listener for clients that reach it over `transport` and serves MQTT on it
    /// until shutdown. Returns the bound address.
    pub async fn listen_on(
        &self,
        addr: SocketAddr,
        transport: Transport,
    ) -> std::io::Result<SocketAddr> {
        crate::listener::listen(&self.inner, addr, transport, None).await
    }

    /// As [`Self::listen_on`], for a listener behind a load balancer or reverse proxy that
    /// starts every connection with a PROXY protocol header (see
    /// [`crate::transport::proxy`]): clients are taken to be where the header says.
    pub async fn listen_behind_proxy(
        &self,
        addr: SocketAddr,
        transport: Transport,
        proxy: crate::transport::ProxyProtocol,
    ) -> std::io::Result<SocketAddr> {
        crate::listener::listen(&self.inner, addr, transport, Some(Arc::new(proxy))).await
    }

    /// Claims topic filters for an in-process service: publishes to matching topics go to the
    /// service instead of subscribers, and it hears every client connect and disconnect.
    pub fn claim(&self, filters: &[&str], service: Arc<dyn Service>) {
        self.inner.claim(filters, service);
    }

    /// Publishes a message as the broker itself, routed to subscribers like any other.
    pub fn publish(&self, m: OutboundMessage) {
        self.inner.publish(m);
    }

    /// Puts a message straight into one client's session, whether or not it subscribed.
    /// Returns false when the client has no session.
    pub fn deliver(&self, client_id: &str, m: OutboundMessage) -> bool {
        let Some(session) = self.inner.sessions.lock().get(client_id).cloned() else {
            return false;
        };
        let msg = Arc::new(Message {
            retain: false,
            ..Message::from_service(m)
        });
        let d = Delivery {
            qos: msg.qos,
            message: msg,
            retain: false,
            subscription_ids: Vec::new(),
        };
        session.enqueue(d, self.inner.queue_limits()) == Enqueued::Yes
    }

    /// Closes one connection of a client; MQTT 5 clients first receive DISCONNECT with
    /// `reason_code`. Returns false when that connection is no longer there.
    pub fn disconnect_client(&self, client_id: &str, connection_id: u64, reason_code: u8) -> bool {
        let Some(session) = self.inner.sessions.lock().get(client_id).cloned() else {
            return false;
        };
        session.close(connection_id, Some(reason_code))
    }

    /// Puts an authorization policy in force (`None`: every client may do everything). Connected
    /// clients stay: the policy applies to their next operation, and their subscriptions it
    /// does not allow are removed now.
    pub fn set_policy(&self, policy: Option<Arc<dyn crate::access::Policy>>) {
        self.inner.policy.replace(policy);
        self.inner.apply_policy();
    }

    /// Reserves a topic namespace for the server (see [`crate::access::Reserved`]).
    pub fn reserve(&self, reserved: crate::access::Reserved) {
        self.inner.reserve(reserved);
    }

    /// What the broker has counted so far, without the gauges (which look at every session).
    pub fn counters(&self) -> crate::stats::BrokerStats {
        crate::stats::BrokerStats::counters(&self.inner.stats, &self.inner.categories)
    }

    /// What the broker has counted so far, and its gauges now.
    pub fn stats(&self) -> crate::stats::BrokerStats {
        let inner = &self.inner;
        let mut stats = crate::stats::BrokerStats::counters(&inner.stats, &inner.categories);
        let sessions: Vec<Arc<crate::session::Session>> =
            inner.sessions.lock().values().cloned().collect();
        stats.total_sessions = sessions.len() as u64;
        for s in &sessions {
            let st = s.state.lock();
            stats.connected_sessions += u64::from(st.link.is_some());
            stats.total_subscriptions += st.subscriptions.len() as u64;
        }
        stats.retained_messages = inner.retained.read().len() as u64;
        stats.retained_bytes = inner.retained.read().bytes();
        stats.connections = crate::connection::KINDS
            .iter()
            .zip(&inner.live_by_kind)
            .map(|(kind, n)| (*kind, n.load(Ordering::Relaxed) as u64))
            .collect();
        stats
    }

    /// A value per connection thread for a service's own counters (see
    /// [`crate::stats::PerThread`]): a service runs on its publishers' connection threads.
    pub fn per_thread<T: Default>(&self) -> crate::stats::PerThread<T> {
        crate::stats::PerThread::new(self.inner.threads.len())
    }

    /// A counter that moves whenever persistent sessions change, so a saver can skip writing
    /// them when nothing happened.
    pub fn session_changes(&self) -> u64 {
        self.inner.session_changes.load(Ordering::Relaxed)
    }

    /// Persistent sessions, and the messages they hold, as plain data; `retained` is left
    /// empty (see [`Broker::take_retained_changes`]).
    pub fn export_sessions(&self) -> crate::persist::BrokerState {
        self.inner.export_sessions()
    }

    /// The retained messages changed since the last call: all of them the first time, after
    /// [`Broker::retained_changes_lost`], or after every retained message was dropped at once.
    pub fn take_retained_changes(&self) -> crate::RetainedChanges {
        self.inner.retained.write().take_changes()
    }

    /// Counts every retained message as changed again, for a saver whose last write failed.
    pub fn retained_changes_lost(&self) {
        self.inner.retained.write().all_changed();
    }

    /// Counts no retained message as changed: the ones imported are saved as they are.
    pub fn retained_saved(&self) {
        self.inner.retained.write().nothing_changed();
    }

    /// Loads saved state; call before binding listeners.
    pub fn import_state(
        &self,
        state: crate::persist::BrokerState,
    ) -> Result<(), crate::persist::ImportError> {
        self.inner.import_state(state)
    }

    /// Whether the connection threads are pinned one to each CPU the process may use, so that
    /// another busy thread of the process would share a CPU with one of them.
    pub fn connection_threads_on_every_cpu(&self) -> bool {
        self.inner.threads.on_every_cpu()
    }

    /// Lends the last connection thread out for other work to run on beside its connections
    /// (`None` once lent, or after [`Broker::shutdown`]). [`Broker::shutdown`] does not stop a
    /// lent thread; dropping the [`crate::LentThread`] does.
    pub fn lend_connection_thread(&self) -> Option<crate::LentThread> {
        self.inner.threads.lend_last()
    }

    /// How many times a new connection for a client id waited in vain for the connection it
    /// took over to finish what it had received (a second each).
    pub fn handovers_unanswered(&self) -> u64 {
        self.inner.handovers_unanswered.load(Ordering::Relaxed)
    }

    /// Number of connected clients.
    pub fn connection_count(&self) -> usize {
        self.inner.live_connections.load(Ordering::Relaxed)
    }

    /// Number of sessions (connected or kept for later).
    pub fn session_count(&self) -> usize {
        self.inner.sessions.lock().len()
    }

    /// Bytes queued in every session now, and the most they may hold (0: no limit).
    pub fn queued_bytes(&self) -> (u64, u64) {
        let b = &self.inner.queue_budget;
        (b.used(), b.limit())
    }

    /// Number of retained messages.
    pub fn retained_count(&self) -> usize {
        self.inner.retained.read().len()
    }

    /// Stops accepting, sends DISCONNECT 0x8B to every client and waits (bounded) for the
    /// connections to close.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let _ = self.inner.shutdown.send(true);
        let deadline = Instant::now() + grace;
        while self.connection_count() > 0 && Instant::now() < deadline {
            let wait = self.inner.connection_closed.notified();
            let _ = tokio::time::timeout(Duration::from_millis(50), wait).await;
        }
        self.inner.threads.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// A broker whose every handle is dropped without a shutdown stops accepting: its
    /// accepting threads go with it, and so do the listeners.
    #[tokio::test]
    async fn a_dropped_broker_stops_listening() {
        let broker = Broker::new(BrokerConfig::default()).expect("broker");
        let addr = broker
            .listen("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("listen");
        let inner = Arc::downgrade(&broker.inner);
        drop(broker);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_ok() {
            assert!(
                Instant::now() < deadline,
                "{addr} still accepts after the broker was dropped"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(inner.upgrade().is_none(), "nothing keeps the broker alive");
    }
}
