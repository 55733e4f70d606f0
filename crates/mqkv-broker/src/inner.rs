//! The broker's shared state ([`Inner`]): sessions, subscriptions, retained messages and the
//! services' claims, and what connections do with them: attach and detach sessions, route
//! messages, keep retained messages, publish wills, expire sessions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use tokio::sync::watch;

use crate::auth::Authenticator;
use crate::codec::SubscriptionOptions;
use crate::config::BrokerConfig;
use crate::placement::ConnThreads;
use crate::service::{ClientIdentity, OutboundMessage, Service};
use crate::session::{Delivery, Enqueued, Message, PendingWill, QueueLimits, Session};
use crate::subtree::{ClientId, Matches, SubEntry, SubTree};
use crate::topic;

/// Subscribers of one publish that the publishing task writes to directly (see `route`). A
/// limit of 64 cost about a sixth of QoS 1 fan-out throughput to 256 subscribers
/// (`mqkv-bench --workloads fanout`); 256 keeps the largest fan-out measured fully direct and
/// bounds the syscalls one publish makes on its own task.
const DIRECT_WRITES_PER_PUBLISH: usize = 256;

/// Most subscribers of one publish that the publishing task also writes to when another thread
/// serves them. A hand-over to that thread costs it a wake-up, which on a virtual machine whose
/// idle vCPUs halt is most of a lone message's latency: QoS 1 p99 at 1,000 msg/s went from about
/// 250 to 330 µs (`mqkv-bench --workloads rate`). A larger fan-out is spread over the threads
/// that serve its subscribers, one wake-up per thread for the whole publish.
const DIRECT_REMOTE_WRITES: usize = 4;

/// Longest a new connection waits for the one it takes over to finish what it received.
const HANDOVER_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct ServiceClaim {
    pub(crate) filters: Vec<String>,
    pub(crate) service: Arc<dyn Service>,
}

/// A connection's own copy of the service claims, renewed when they change: finding the service
/// of a topic then takes no lock and no reference count that every connection shares.
pub(crate) struct ServiceClaims {
    version: u64,
    claims: Vec<ServiceClaim>,
    /// The namespaces reserved for the server.
    pub(crate) reserved: Vec<Arc<crate::access::Reserved>>,
}

impl ServiceClaims {
    /// The service claiming `topic`, if any.
    pub(crate) fn find(&self, topic: &str) -> Option<&Arc<dyn Service>> {
        self.claims
            .iter()
            .find(|s| s.filters.iter().any(|f| topic::matches(f, topic)))
            .map(|s| &s.service)
    }
}

pub(crate) struct Inner {
    pub config: BrokerConfig,
    pub auth: Arc<dyn Authenticator>,
    pub sessions: Mutex<HashMap<ClientId, Arc<Session>>>,
    pub subs: RwLock<SubTree<Arc<Session>>>,
    pub(crate) retained: RwLock<crate::retained::Retained>,
    pub(crate) services: RwLock<Vec<ServiceClaim>>,
    /// Bumped, under the `services` lock, by every claim.
    pub(crate) services_version: AtomicU64,
    pub(crate) next_conn_id: AtomicU64,
    pub shutdown: watch::Sender<bool>,
    /// Set before `shutdown` sends: a connection's read loop checks this flag instead of
    /// polling its shutdown future on every packet (see `Conn::read_loop`).
    pub shutting_down: AtomicBool,
    pub live_connections: AtomicUsize,
    /// Bumped on every change to persistent sessions worth saving (see
    /// `Broker::session_changes`).
    pub session_changes: AtomicU64,
    pub connection_closed: tokio::sync::Notify,
    /// Slows down addresses that keep failing to authenticate.
    pub(crate) throttle: crate::auth::Throttle,
    /// The authorization policy in force, if any.
    pub(crate) policy: crate::access::PolicySlot,
    /// Namespaces only the server publishes in.
    pub(crate) reserved: RwLock<Vec<Arc<crate::access::Reserved>>>,
    /// What the broker counted, per connection thread.
    pub(crate) stats: Arc<crate::stats::PerThread<crate::stats::Counters>>,
    /// The metric categories clients named.
    pub(crate) categories: crate::stats::Categories,
    /// The bytes every session queue together may hold.
    pub(crate) queue_budget: Arc<crate::queue::QueueBudget>,
    /// Open connections by listener kind: `tcp`, `tls`, `ws`, `wss`.
    pub(crate) live_by_kind: [AtomicUsize; 4],
    /// Open connections per address, when they are limited.
    pub(crate) per_address: Mutex<HashMap<std::net::IpAddr, u32>>,
    /// Takeovers whose old connection did not answer within [`HANDOVER_WAIT`].
    pub(crate) handovers_unanswered: AtomicU64,
    pub(crate) threads: ConnThreads,
    /// The other nodes of a cluster, once installed.
    pub(crate) federation: std::sync::OnceLock<Arc<dyn crate::federation::Federation>>,
}

/// How a session attach went.
pub(crate) struct Attached {
    pub session: Arc<Session>,
    pub session_present: bool,
}

impl Inner {
    pub(crate) fn new(
        config: BrokerConfig,
        auth: Arc<dyn Authenticator>,
        threads: ConnThreads,
    ) -> Inner {
        let (shutdown, _) = watch::channel(false);
        let queue_budget = Arc::new(crate::queue::QueueBudget::new(config.max_queued_bytes));
        Inner {
            config,
            auth,
            sessions: Mutex::new(HashMap::new()),
            subs: RwLock::new(SubTree::default()),
            retained: RwLock::new(crate::retained::Retained::default()),
            services: RwLock::new(Vec::new()),
            services_version: AtomicU64::new(0),
            next_conn_id: AtomicU64::new(1),
            shutdown,
            shutting_down: AtomicBool::new(false),
            live_connections: AtomicUsize::new(0),
            session_changes: AtomicU64::new(0),
            federation: std::sync::OnceLock::new(),
            connection_closed: tokio::sync::Notify::new(),
            handovers_unanswered: AtomicU64::new(0),
            throttle: crate::auth::Throttle::default(),
            policy: crate::access::PolicySlot::default(),
            reserved: RwLock::new(Vec::new()),
            stats: Arc::new(crate::stats::PerThread::new(threads.len())),
            categories: crate::stats::Categories::default(),
            queue_budget,
            live_by_kind: Default::default(),
            per_address: Mutex::new(HashMap::new()),
            threads,
        }
    }
}

/// Which of the matching shared groups on this node get a message.
#[derive(Debug, Clone, Copy)]
pub enum SharedHere<'a> {
    All,
    /// Only those with these keys.
    Only(&'a [String]),
}

impl Inner {
    pub fn queue_limits(&self) -> QueueLimits {
        QueueLimits {
            max_queued: self.config.max_queued_messages,
            policy: self.config.queue_full,
        }
    }

    pub fn next_connection_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Claims topic filters for an in-process service (see `Broker::claim`).
    pub(crate) fn claim(&self, filters: &[&str], service: Arc<dyn Service>) {
        let mut services = self.services.write();
        services.push(ServiceClaim {
            filters: filters.iter().map(|f| (*f).to_owned()).collect(),
            service,
        });
        self.services_version.fetch_add(1, Ordering::Release);
    }

    /// The current service claims, to keep.
    pub(crate) fn service_claims(&self) -> ServiceClaims {
        let services = self.services.read();
        ServiceClaims {
            version: self.services_version.load(Ordering::Acquire),
            claims: services.clone(),
            reserved: self.reserved.read().clone(),
        }
    }

    /// Reserves a namespace for the server; connections see it as they see a new claim.
    pub(crate) fn reserve(&self, reserved: crate::access::Reserved) {
        let _services = self.services.write();
        self.reserved.write().push(Arc::new(reserved));
        self.services_version.fetch_add(1, Ordering::Release);
    }

    /// Renews `mine` if a claim was made since it was taken.
    pub(crate) fn renew_service_claims(&self, mine: &mut ServiceClaims) {
        if self.services_version.load(Ordering::Acquire) != mine.version {
            *mine = self.service_claims();
        }
    }

    /// Every service, for connect and disconnect events.
    pub fn services(&self) -> Vec<Arc<dyn Service>> {
        self.services
            .read()
            .iter()
            .map(|s| s.service.clone())
            .collect()
    }

    pub fn touch(&self) {
        self.session_changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Stores (or, with an empty payload, clears) the retained message of a topic.
    pub fn retain(&self, msg: Arc<Message>) {
        self.retained.write().set(&msg);
    }

    /// Whether a retained message of `payload` on `topic` fits the limits on retained
    /// messages (`max_retained_messages`, `max_retained_bytes`), counting the one it replaces.
    pub(crate) fn retained_room(&self, topic: &str, payload: &[u8]) -> bool {
        self.retained.read().room(
            topic,
            payload,
            self.config.max_retained_messages,
            self.config.max_retained_bytes,
        )
    }

    /// Routes a message a service sends, as a client's publish would be routed.
    pub(crate) fn publish(&self, m: OutboundMessage) {
        self.route(Arc::new(Message::from_service(m)));
    }

    /// Routes a message published on this node to every matching subscription here and, in a
    /// cluster, hands it to the other nodes; returns how many sessions here and nodes elsewhere
    /// it went to.
    pub fn route(&self, msg: Arc<Message>) -> usize {
        let Some(federation) = self.federation.get() else {
            return self.route_local(msg);
        };
        let forwarded = federation.forward(&msg);
        if msg.retain {
            self.retain(msg.clone());
        }
        let shared = match &forwarded.shared_here {
            None => SharedHere::All,
            Some(keys) => SharedHere::Only(keys),
        };
        self.deliver_local(msg, shared) + forwarded.nodes
    }

    /// Tells the other nodes, if any, that this node's subscribed filters may have changed.
    fn filters_changed(&self) {
        if let Some(federation) = self.federation.get() {
            federation.filters_changed();
        }
    }

    /// Drops every retained message.
    pub(crate) fn clear_retained(&self) {
        self.retained.write().clear();
    }

    /// Routes a message to every matching subscription here and updates the retained store.
    pub fn route_local(&self, msg: Arc<Message>) -> usize {
        if msg.retain {
            self.retain(msg.clone());
        }
        self.deliver_local(msg, SharedHere::All)
    }

    /// Routes a message to every matching plain subscription here and to the shared groups
    /// `shared` names, leaving the retained store as it is.
    pub(crate) fn deliver_local(&self, msg: Arc<Message>, shared: SharedHere<'_>) -> usize {
        let mut targets: SmallVec<[(Arc<Session>, Delivery); 4]> = SmallVec::new();
        {
            let subs = self.subs.read();
            let mut m: Matches<'_, Arc<Session>> = Matches::default();
            let route = subs.route(&msg.topic, &mut m);
            let publisher = msg.publisher.as_deref();
            // A filtered subscription gets only what its session may receive.
            let not_own = |(c, e, s): &(&ClientId, &SubEntry, &Arc<Session>)| {
                !(e.options.no_local && Some(&***c) == publisher)
                    && (!e.filtered || s.may_receive(&msg.topic))
            };
            let mut direct: SmallVec<[(&ClientId, &SubEntry, &Arc<Session>); 4]> = match &route {
                Some(route) => route
                    .iter()
                    .map(|(c, e, s)| (c, e, s))
                    .filter(not_own)
                    .collect(),
                None => m
                    .direct
                    .iter()
                    .map(|(c, (e, s))| (*c, e, s))
                    .filter(not_own)
                    .collect(),
            };
            if direct.len() > 1 {
                direct.sort_by(|a, b| a.0.cmp(b.0));
            }
            let mut i = 0;
            while i < direct.len() {
                let (client, first, session) = direct[i];
                let mut qos = first.options.qos;
                let mut rap = first.options.retain_as_published;
                let mut ids: Vec<u32> = first.identifier.into_iter().collect();
                let mut j = i + 1;
                while j < direct.len() && direct[j].0 == client {
                    let e = direct[j].1;
                    qos = qos.max(e.options.qos);
                    rap |= e.options.retain_as_published;
                    ids.extend(e.identifier);
                    j += 1;
                }
                targets.push((
                    session.clone(),
                    Delivery {
                        message: msg.clone(),
                        qos: qos.min(msg.qos),
                        retain: rap && msg.retain,
                        subscription_ids: ids,
                    },
                ));
                i = j;
            }
            for group in m.shared {
                if let SharedHere::Only(keys) = shared {
                    if !keys.iter().any(|k| **k == *group.key) {
                        continue;
                    }
                }
                // Prefer a connected member; a group with none online still gets the message
                // queued at the next member in turn.
                let mut chosen = None;
                for member in group.rotation() {
                    if chosen.is_none() {
                        chosen = Some(member);
                    }
                    if member.2.state.lock().link.is_some() {
                        chosen = Some(member);
                        break;
                    }
                }
                if let Some((_, e, session)) = chosen {
                    targets.push((
                        session.clone(),
                        Delivery {
                            message: msg.clone(),
                            qos: e.options.qos.min(msg.qos),
                            retain: e.options.retain_as_published && msg.retain,
                            subscription_ids: e.identifier.into_iter().collect(),
                        },
                    ));
                }
            }
        }
        let limits = self.queue_limits();
        let here = crate::placement::current_home();
        // Where messages come from is counted only when connections may move for it.
        let from = if self.config.co_locate { here } else { 0 };
        let n = targets.len();
        let spread = n > DIRECT_REMOTE_WRITES;
        let fan_out = n > 1;
        if n > 0 {
            self.touch();
        }
        for (i, (session, d)) in targets.into_iter().enumerate() {
            // The publishing task writes to the first subscribers served by its own thread
            // itself (to all of them, in a small fan-out), and posts the others' to their
            // threads; beyond the first few hundred, their writer tasks write, so one large
            // fan-out does not hold this task (and the clients sharing its thread) for a syscall
            // per subscriber.
            let (queued, direct) = if i < DIRECT_WRITES_PER_PUBLISH {
                session.enqueue_direct(d, limits, from)
            } else {
                (session.enqueue(d, limits), None)
            };
            if queued == Enqueued::Dropped {
                tracing::debug!(client_id = %session.client_id, "queue full: message dropped");
            }
            if let Some(direct) = direct {
                if direct.home == here || !spread {
                    direct.output.write_ready(fan_out);
                } else {
                    self.threads.post(direct.home, direct.output, fan_out);
                }
            }
        }
        n
    }

    /// Retained messages matching a filter, skipping (and forgetting) expired ones.
    pub fn retained_matching(&self, filter: &str) -> Vec<Arc<Message>> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut expired = Vec::new();
        {
            let retained = self.retained.read();
            if !topic::has_wildcard(filter) {
                if let Some(m) = retained.get(filter) {
                    if m.expired(now) {
                        expired.push(m.topic.clone());
                    } else {
                        out.push(m.clone());
                    }
                }
            } else {
                for (t, m) in retained.iter() {
                    if topic::matches(filter, t) {
                        if m.expired(now) {
                            expired.push(t.clone());
                        } else {
                            out.push(m.clone());
                        }
                    }
                }
            }
        }
        // In topic order, the same every time, rather than the map's.
        out.sort_unstable_by(|a, b| a.topic.cmp(&b.topic));
        if !expired.is_empty() {
            let mut retained = self.retained.write();
            for t in expired {
                retained.remove_expired(&t, now);
            }
        }
        out
    }

    /// Lets the connection currently on `client_id`'s session, if any, finish what it received
    /// before a new connection takes the session over (see [`crate::session::Handover`]).
    pub(crate) async fn hand_over(&self, client_id: &ClientId) {
        let session = self.sessions.lock().get(client_id).cloned();
        let handover =
            session.and_then(|s| s.state.lock().link.as_ref().map(|l| l.handover.clone()));
        if let Some(handover) = handover {
            if !handover.ask_and_wait(HANDOVER_WAIT).await {
                self.handovers_unanswered.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(client_id = %client_id, "the connection taken over did not answer in time");
            }
        }
    }

    /// Attaches a new connection to the session for `client_id`, creating or replacing it.
    pub fn attach(
        &self,
        client_id: &ClientId,
        clean_start: bool,
        expiry_interval: u32,
        link: crate::session::Link,
    ) -> Attached {
        let mut sessions = self.sessions.lock();
        let existing = sessions.get(client_id).cloned();
        if let Some(old) = &existing {
            // Any connection still on it is taken over.
            let mut st = old.state.lock();
            if let Some(l) = st.link.take() {
                l.notify.notify_one();
            }
        }
        let (session, present) = match existing {
            Some(old) if !clean_start => (old, true),
            old => {
                if let Some(old) = old {
                    self.drop_subscriptions(&old);
                }
                let s = Arc::new(Session::new(client_id.clone()));
                sessions.insert(client_id.clone(), s.clone());
                (s, false)
            }
        };
        {
            let mut st = session.state.lock();
            st.link = Some(link);
            st.stats = Some(self.stats.clone());
            st.queue.use_budget(&self.queue_budget);
            st.expiry_interval = expiry_interval;
            st.disconnected_at = None;
            // Resuming within the will delay cancels the will.
            st.pending_will = None;
        }
        self.touch();
        self.session_changed(client_id);
        Attached {
            session,
            session_present: present,
        }
    }

    /// Removes a session's subscriptions from the index.
    pub(crate) fn drop_subscriptions(&self, session: &Arc<Session>) {
        let filters: Vec<String> = session.state.lock().subscriptions.keys().cloned().collect();
        let mut subs = self.subs.write();
        for f in &filters {
            if let Some(spec) = topic::parse_filter(f) {
                subs.remove(spec.filter, spec.group, &session.client_id);
            }
        }
        drop(subs);
        if !filters.is_empty() {
            self.filters_changed();
        }
    }

    /// Adds a subscription. Returns whether it existed before.
    pub fn subscribe(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) -> bool {
        self.subscribe_checked(session, filter, options, identifier, false)
    }

    /// Adds a subscription whose messages are, when `filtered`, each checked against the
    /// session's grants before delivery. Returns whether it existed before.
    pub(crate) fn subscribe_checked(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
        filtered: bool,
    ) -> bool {
        let Some(spec) = topic::parse_filter(filter) else {
            return false;
        };
        let mut subs = self.subs.write();
        let e = SubEntry {
            options,
            identifier,
            filtered,
        };
        let existed = subs.insert(
            spec.filter,
            spec.group,
            &session.client_id,
            e,
            session.clone(),
        );
        {
            let mut st = session.state.lock();
            st.subscriptions
                .insert(filter.to_owned(), (options, identifier));
            if filtered {
                st.filtered.insert(filter.to_owned());
            } else {
                st.filtered.remove(filter);
            }
        }
        drop(subs);
        if !existed {
            self.filters_changed();
        }
        self.session_changed(&session.client_id);
        existed
    }

    pub fn unsubscribe(&self, session: &Arc<Session>, filter: &str) -> bool {
        let Some(spec) = topic::parse_filter(filter) else {
            return false;
        };
        let mut subs = self.subs.write();
        let removed = subs.remove(spec.filter, spec.group, &session.client_id);
        {
            let mut st = session.state.lock();
            st.subscriptions.remove(filter);
            st.filtered.remove(filter);
        }
        drop(subs);
        self.touch();
        if removed {
            self.filters_changed();
        }
        self.session_changed(&session.client_id);
        removed
    }

    /// Detaches a closed connection. `will` is published now, later, or never, as the will
    /// delay and the session's fate decide.
    pub fn detach(&self, session: &Arc<Session>, conn_id: u64, will: Option<(Arc<Message>, u32)>) {
        self.detach_here(session, conn_id, will);
        // Whatever became of the session, the cluster no longer keeps this connection's will.
        self.session_changed(&session.client_id);
    }

    fn detach_here(&self, session: &Arc<Session>, conn_id: u64, will: Option<(Arc<Message>, u32)>) {
        let now = Instant::now();
        self.touch();
        let mut sessions = self.sessions.lock();
        let mut st = session.state.lock();
        let ours = st.link.as_ref().is_some_and(|l| l.conn_id == conn_id);
        if !ours {
            // Taken over: a new connection owns the session already; a will with no delay
            // is due at once, a delayed one is cancelled by the new connection.
            drop(st);
            drop(sessions);
            if let Some((m, 0)) = will {
                self.route(m);
            }
            return;
        }
        st.link = None;
        st.disconnected_at = Some(now);
        if st.expiry_interval == 0 {
            drop(st);
            if sessions
                .get(&session.client_id)
                .is_some_and(|s| Arc::ptr_eq(s, session))
            {
                sessions.remove(&session.client_id);
            }
            self.drop_subscriptions(session);
            drop(sessions);
            if let Some((m, _)) = will {
                self.route(m);
            }
            return;
        }
        match will {
            Some((m, 0)) => {
                drop(st);
                drop(sessions);
                self.route(m);
            }
            Some((m, delay)) => {
                let delay = delay.min(st.expiry_interval);
                st.pending_will = Some(PendingWill {
                    message: m,
                    due: now + Duration::from_secs(u64::from(delay)),
                });
            }
            None => {}
        }
    }

    /// Publishes wills whose delay has passed and ends sessions whose expiry has passed.
    pub(crate) fn sweep(&self, now: Instant) {
        let mut wills = Vec::new();
        let mut ended = Vec::new();
        {
            let mut sessions = self.sessions.lock();
            sessions.retain(|_, s| {
                let mut st = s.state.lock();
                if st.link.is_some() {
                    return true;
                }
                if st.pending_will.as_ref().is_some_and(|w| w.due <= now) {
                    if let Some(w) = st.pending_will.take() {
                        wills.push(w.message);
                    }
                }
                let expired = match (st.disconnected_at, st.expiry_interval) {
                    (_, u32::MAX) | (None, _) => false,
                    (Some(at), secs) => now >= at + Duration::from_secs(u64::from(secs)),
                };
                if expired {
                    if let Some(w) = st.pending_will.take() {
                        wills.push(w.message);
                    }
                    drop(st);
                    ended.push(s.clone());
                    return false;
                }
                true
            });
            for s in &ended {
                self.drop_subscriptions(s);
            }
            if !ended.is_empty() {
                self.touch();
            }
        }
        for s in &ended {
            self.session_changed(&s.client_id);
        }
        for w in wills {
            self.route(w);
        }
    }
}

impl Inner {
    /// Creates `client_id`'s session, disconnected, from a record kept by the cluster, unless
    /// the session is here already.
    pub(crate) fn restore(
        &self,
        client_id: &crate::subtree::ClientId,
        record: crate::replicated::SessionRecord,
    ) {
        let session = {
            let mut sessions = self.sessions.lock();
            if sessions.contains_key(client_id) {
                return;
            }
            let session = Arc::new(Session::new(client_id.clone()));
            {
                let mut st = session.state.lock();
                st.queue.use_budget(&self.queue_budget);
                st.expiry_interval = record.expiry_interval;
                st.disconnected_at = Some(Instant::now());
            }
            sessions.insert(client_id.clone(), session.clone());
            session
        };
        for sub in &record.subscriptions {
            if let Some(options) = sub.options() {
                self.subscribe(&session, &sub.filter, options, sub.identifier);
            }
        }
    }

    /// Tells the cluster, if any, that `client_id`'s session changed.
    pub(crate) fn session_changed(&self, client_id: &str) {
        if let Some(federation) = self.federation.get() {
            federation.session_changed(client_id);
        }
    }
}

/// The identity a service sees for a connection.
pub(crate) fn identity(
    client_id: &ClientId,
    principal: Arc<crate::access::Principal>,
    grants: Option<Arc<dyn crate::access::Grants>>,
    peer: SocketAddr,
    conn_id: u64,
) -> ClientIdentity {
    ClientIdentity {
        client_id: client_id.clone(),
        principal,
        grants,
        peer,
        connection_id: conn_id,
    }
}
