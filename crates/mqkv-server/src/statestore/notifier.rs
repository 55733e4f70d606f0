//! Key notifications: who observes which keys, and the notifications every applied change
//! sends them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use mqkv_broker::access::Policy;
use mqkv_broker::codec::{PropStr, Properties, QoS};
use mqkv_broker::{Broker, ClientIdentity, OutboundMessage};
use mqkv_protocol::properties as prop;
use mqkv_protocol::{notification_topic, Command, GlobPattern, Hlc};
use mqkv_raft::ApplyHook;
use mqkv_store::{Applied, ChangeEvent, Entry, Op, Request};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

/// Who observes which keys, per connection.
#[derive(Default)]
pub(super) struct Observers {
    by_key: HashMap<Bytes, HashMap<Arc<str>, u64>>,
    by_connection: HashMap<u64, Observed>,
    /// Pattern watches (an extension), per connection.
    patterns: HashMap<u64, Patterns>,
    /// For a watch that resumed (`KEYNOTIFY key SINCE version`), by connection and key: the
    /// newest version its replay covered. A change at or below it was replayed already and is
    /// not sent again; the first one above it ends the entry.
    replayed: HashMap<(u64, Bytes), Hlc>,
}

/// Whether a hash map or set holding `len` entries in room for `capacity` should shrink: it
/// holds less than a quarter of its room.
fn sparse(len: usize, capacity: usize) -> bool {
    capacity > 64 && len < capacity / 4
}

/// Shrinks a sparse map to twice its entries.
fn shrink_when_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if sparse(map.len(), map.capacity()) {
        map.shrink_to(map.len() * 2);
    }
}

/// The pattern watches of one connection.
struct Patterns {
    who: ClientIdentity,
    /// Each pattern, compiled, with the version a resumed watch started after: changes at or
    /// below it are not the watch's.
    globs: Vec<(Bytes, GlobPattern, Option<Hlc>)>,
}

/// What one connection observes.
struct Observed {
    who: ClientIdentity,
    keys: HashSet<Bytes>,
}

impl Observers {
    /// Registers `who` as an observer of `key`, unless its connection already observes `max`
    /// other keys; returns whether it observes the key now.
    pub(super) fn start(&mut self, who: &ClientIdentity, key: &Bytes, max: usize) -> bool {
        let on_connection = self.by_connection.get(&who.connection_id);
        if on_connection.is_some_and(|o| o.keys.len() >= max && !o.keys.contains(key)) {
            return false;
        }
        // The key is copied: the request's bytes it came from share a read buffer with other
        // packets, and a registration that kept a slice of them would keep all of it.
        let key = match self.by_key.get_key_value(key) {
            Some((known, _)) => known.clone(),
            None => Bytes::copy_from_slice(key),
        };
        self.by_key
            .entry(key.clone())
            .or_default()
            .insert(who.client_id.clone(), who.connection_id);
        self.by_connection
            .entry(who.connection_id)
            .or_insert_with(|| Observed {
                who: who.clone(),
                keys: HashSet::new(),
            })
            .keys
            .insert(key.clone());
        true
    }

    /// Returns whether the key was observed by this client.
    pub(super) fn stop(&mut self, who: &ClientIdentity, key: &Bytes) -> bool {
        if !self.replayed.is_empty() {
            self.replayed.remove(&(who.connection_id, key.clone()));
        }
        let Some(clients) = self.by_key.get_mut(key) else {
            return false;
        };
        let Some(conn) = clients.remove(&who.client_id) else {
            return false;
        };
        if clients.is_empty() {
            self.by_key.remove(key);
        }
        if let Some(observed) = self.by_connection.get_mut(&conn) {
            observed.keys.remove(key);
            if sparse(observed.keys.len(), observed.keys.capacity()) {
                observed.keys.shrink_to(observed.keys.len() * 2);
            }
            if observed.keys.is_empty() {
                self.by_connection.remove(&conn);
            }
        }
        self.give_back_room();
        true
    }

    /// Registers a pattern watch of `who` on the glob `pattern`, unless its connection already
    /// has `max` others; returns whether it watches the pattern now.
    pub(super) fn start_pattern(
        &mut self,
        who: &ClientIdentity,
        pattern: &Bytes,
        max: usize,
    ) -> bool {
        self.start_pattern_after(who, pattern, None, max)
    }

    /// [`Observers::start_pattern`] for a watch that resumes after version `after` (which
    /// replaces the one a watch of the same pattern had).
    fn start_pattern_after(
        &mut self,
        who: &ClientIdentity,
        pattern: &Bytes,
        after: Option<Hlc>,
        max: usize,
    ) -> bool {
        let watches = self
            .patterns
            .entry(who.connection_id)
            .or_insert_with(|| Patterns {
                who: who.clone(),
                globs: Vec::new(),
            });
        if let Some(watch) = watches.globs.iter_mut().find(|(p, _, _)| p == pattern) {
            watch.2 = after;
            return true;
        }
        if watches.globs.len() >= max {
            return false;
        }
        watches
            .globs
            .push((pattern.clone(), GlobPattern::new(pattern), after));
        true
    }

    /// Ends a pattern watch; returns whether there was one.
    pub(super) fn stop_pattern(&mut self, who: &ClientIdentity, pattern: &Bytes) -> bool {
        let Some(watches) = self.patterns.get_mut(&who.connection_id) else {
            return false;
        };
        let before = watches.globs.len();
        watches.globs.retain(|(p, _, _)| p != pattern);
        let stopped = watches.globs.len() < before;
        if watches.globs.is_empty() {
            self.patterns.remove(&who.connection_id);
        }
        stopped
    }

    /// Ends the observations that `policy` (just put in force) no longer allows.
    pub(super) fn apply_policy(&mut self, policy: &dyn Policy) {
        // A pattern watch stays; each key it matches is checked against the new grants.
        for watches in self.patterns.values_mut() {
            let who = &watches.who;
            watches.who.grants = Some(policy.grants(&who.client_id, &who.principal));
        }
        let mut ended = Vec::new();
        for observed in self.by_connection.values() {
            let who = &observed.who;
            let grants = policy.grants(&who.client_id, &who.principal);
            for key in &observed.keys {
                if !grants.may_use(key, false) {
                    ended.push((who.clone(), key.clone()));
                }
            }
        }
        for (who, key) in ended {
            tracing::info!(client_id = %who.client_id, "key observation no longer allowed by the policy: ended");
            self.stop(&who, &key);
        }
    }

    /// Drops every registration made on a connection that has closed.
    pub(super) fn connection_closed(&mut self, connection_id: u64) {
        self.patterns.remove(&connection_id);
        if !self.replayed.is_empty() {
            self.replayed.retain(|(conn, _), _| *conn != connection_id);
        }
        let Some(observed) = self.by_connection.remove(&connection_id) else {
            return;
        };
        for key in observed.keys {
            if let Some(clients) = self.by_key.get_mut(&key) {
                clients.retain(|_, c| *c != connection_id);
                if clients.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
        self.give_back_room();
    }

    /// Shrinks the maps that are mostly empty: a map keeps the room of the most entries it
    /// ever held, so a flood of registrations that has ended would otherwise stay resident.
    /// Shrinking to twice what is left makes it happen again only after half of that has
    /// gone, so its cost is spread over the removals.
    fn give_back_room(&mut self) {
        shrink_when_sparse(&mut self.by_key);
        shrink_when_sparse(&mut self.by_connection);
        shrink_when_sparse(&mut self.replayed);
    }

    /// The clients to notify of the change of `key` to `version`: its observers (but those
    /// whose resumed watch replayed it already), and the clients with a pattern watch
    /// matching it that may read it (each client once).
    fn observers_of(&mut self, key: &Bytes, version: &Hlc) -> Vec<Arc<str>> {
        let mut clients: Vec<Arc<str>> = match self.by_key.get(&key[..]) {
            None => Vec::new(),
            Some(m) if self.replayed.is_empty() => m.keys().cloned().collect(),
            Some(m) => {
                let replayed = &mut self.replayed;
                m.iter()
                    .filter(|(_, conn)| !already_replayed(replayed, **conn, key, version))
                    .map(|(client, _)| client.clone())
                    .collect()
            }
        };
        for (conn, watches) in &self.patterns {
            let who = &watches.who;
            let wanted = watches.globs.iter().any(|(_, glob, after)| {
                glob.matches(key) && after.as_ref().is_none_or(|after| version > after)
            });
            if wanted
                && who.may_use(key, false)
                && mqkv_protocol::topic::observable(who.client_id.as_bytes(), key)
                && !clients.contains(&who.client_id)
                && !already_replayed(&mut self.replayed, *conn, key, version)
            {
                clients.push(who.client_id.clone());
            }
        }
        clients
    }
}

/// Whether the change of `key` to `version` was replayed already to connection `conn` by a
/// watch that resumed; the first change past what was replayed ends the record of it.
fn already_replayed(
    replayed: &mut HashMap<(u64, Bytes), Hlc>,
    conn: u64,
    key: &Bytes,
    version: &Hlc,
) -> bool {
    if replayed.is_empty() {
        return false;
    }
    let entry = (conn, key.clone());
    match replayed.get(&entry) {
        Some(upto) if version <= upto => true,
        Some(_) => {
            replayed.remove(&entry);
            false
        }
        None => false,
    }
}

/// True for a SET with a deadline, applied or not.
pub(super) fn sets_deadline(entry: &Entry) -> bool {
    matches!(
        &entry.op,
        Op::Request(Request {
            command: Command::Set { px_ms: Some(_), .. },
            ..
        })
    )
}

/// Sends key notifications; shared by the apply hook and the request path (KEYNOTIFY).
pub struct Notifier {
    broker: Broker,
    /// Most keys one connection may observe at once.
    pub(super) max_observed: usize,
    /// Most pattern watches one connection may have at once.
    pub(super) max_patterns: usize,
    pub(super) observers: Mutex<Observers>,
    /// Where notifications sent are counted.
    counters: Arc<super::counters::StoreCounters>,
    /// Poked after an applied SET with a deadline: the earliest deadline may now be sooner
    /// than the one the expiry loop waits for. Nothing else can make it sooner, except a
    /// snapshot installed from another member, which the loop's periodic look catches.
    pub(super) deadline_set: Notify,
    /// Observers inside this process (the dashboard's live feeds), by client id: their
    /// notifications go to a channel instead of an MQTT session.
    local: Mutex<HashMap<Arc<str>, mpsc::Sender<ChangeEvent>>>,
}

impl Notifier {
    pub fn new(
        broker: &Broker,
        max_observed: usize,
        max_patterns: usize,
        counters: Arc<super::counters::StoreCounters>,
    ) -> Arc<Notifier> {
        Arc::new(Notifier {
            broker: broker.clone(),
            max_observed,
            max_patterns,
            counters,
            observers: Mutex::new(Observers::default()),
            deadline_set: Notify::new(),
            local: Mutex::new(HashMap::new()),
        })
    }

    /// Makes `client_id` an observer inside this process: the changes of the keys it observes
    /// (through KEYNOTIFY requests made as that client) come to `sink`, as long as it is open.
    /// A change that finds the channel full is dropped for it (and not counted as sent).
    pub fn attach_local(&self, client_id: Arc<str>, sink: mpsc::Sender<ChangeEvent>) {
        self.local.lock().insert(client_id, sink);
    }

    /// Ends what [`Notifier::attach_local`] started, and the observations of `who`.
    pub fn detach_local(&self, who: &ClientIdentity) {
        self.local.lock().remove(&who.client_id);
        self.observers.lock().connection_closed(who.connection_id);
    }

    /// The hook to install in the store: notifies observers of every applied change, and the
    /// expiry loop of every new deadline. (Waking that loop after every write had cost a
    /// thread wake-up per proposal on the raft thread, and a pass of the loop on a worker.)
    pub fn hook(self: &Arc<Self>) -> ApplyHook {
        let me = self.clone();
        Arc::new(move |entry: &Entry, applied: &Applied| {
            me.notify(applied);
            if sets_deadline(entry) {
                me.deadline_set.notify_one();
            }
        })
    }

    /// Ends the key observations `policy` (just put in force) no longer allows.
    pub fn apply_policy(&self, policy: &dyn Policy) {
        self.observers.lock().apply_policy(policy);
    }

    /// Sends every change's notification to every observer of the key.
    fn notify(&self, applied: &Applied) {
        for event in &applied.events {
            let observers = self
                .observers
                .lock()
                .observers_of(&event.key, &event.version);
            if observers.is_empty() {
                continue;
            }
            let payload = event.notification().encode();
            for client in observers {
                self.send(&client, event, payload.clone());
            }
        }
    }

    /// Sends one change's notification (its encoded `payload`) to `client`.
    fn send(&self, client: &Arc<str>, event: &ChangeEvent, payload: Bytes) {
        if let Some(sink) = self.local.lock().get(client) {
            if sink.try_send(event.clone()).is_ok() {
                mqkv_broker::stats::add(&self.counters.here().notifications_sent, 1);
            }
            return;
        }
        let msg = OutboundMessage {
            topic: notification_topic(client.as_bytes(), &event.key),
            payload,
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Properties {
                content_type: Some(PropStr::Borrowed(prop::CONTENT_TYPE)),
                user_properties: vec![
                    (
                        PropStr::Borrowed(prop::TIMESTAMP),
                        PropStr::Owned(event.version.to_text()),
                    ),
                    (
                        PropStr::Borrowed(prop::PROTOCOL_VERSION),
                        PropStr::Borrowed(prop::PROTOCOL_VERSION_VALUE),
                    ),
                ],
                ..Default::default()
            },
        };
        if self.broker.deliver(client, msg) {
            mqkv_broker::stats::add(&self.counters.here().notifications_sent, 1);
        }
    }

    /// `KEYNOTIFY pattern PATTERN SINCE version`: a pattern watch of `who` that first sends,
    /// in order, every change after `since` of the keys it matches that `history` (the
    /// store's, already filtered by the pattern and the client's grants) still holds. As in
    /// [`Notifier::resume`], nothing is lost or sent twice at the seam.
    pub(super) fn resume_pattern(
        &self,
        who: &ClientIdentity,
        pattern: &Bytes,
        since: &Hlc,
        history: impl FnOnce() -> Result<Vec<ChangeEvent>, mqkv_store::Compacted>,
    ) -> mqkv_protocol::Response {
        use mqkv_protocol::{ErrorKind, Response};
        let mut observers = self.observers.lock();
        let Ok(replay) = history() else {
            return Response::Error(ErrorKind::HistoryCompacted);
        };
        if !observers.start_pattern_after(who, pattern, Some(since.clone()), self.max_patterns) {
            return Response::Error(ErrorKind::QuotaExceeded);
        }
        for event in &replay {
            if !mqkv_protocol::topic::observable(who.client_id.as_bytes(), &event.key) {
                continue;
            }
            observers.replayed.insert(
                (who.connection_id, event.key.clone()),
                event.version.clone(),
            );
            self.send(&who.client_id, event, event.notification().encode());
        }
        drop(observers);
        Response::Ok
    }

    /// `KEYNOTIFY key SINCE version`: observes `key` as `who` and first sends, in order, every
    /// change after `since` that `history` (the store's) still holds. Changes applied while
    /// this runs are neither lost nor sent twice: the observers stay locked from the
    /// registration to the last replayed change, and a live change at or below the last
    /// replayed version is skipped.
    pub(super) fn resume(
        &self,
        who: &ClientIdentity,
        key: &Bytes,
        since: &Hlc,
        history: impl FnOnce() -> Result<Vec<ChangeEvent>, mqkv_store::Compacted>,
    ) -> mqkv_protocol::Response {
        use mqkv_protocol::{ErrorKind, Response};
        if !mqkv_protocol::topic::observable(who.client_id.as_bytes(), key) {
            return Response::Error(ErrorKind::KeyTooLongToObserve);
        }
        let mut observers = self.observers.lock();
        let Ok(replay) = history() else {
            return Response::Error(ErrorKind::HistoryCompacted);
        };
        if !observers.start(who, key, self.max_observed) {
            return Response::Error(ErrorKind::QuotaExceeded);
        }
        let upto = replay
            .last()
            .map_or(since, |e| &e.version)
            .max(since)
            .clone();
        observers
            .replayed
            .insert((who.connection_id, key.clone()), upto);
        for event in &replay {
            self.send(&who.client_id, event, event.notification().encode());
        }
        drop(observers);
        Response::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: Command) -> Entry {
        Entry {
            now_ms: 1,
            op: Op::Request(Request {
                command,
                ts: None,
                ft: None,
                dedup: None,
            }),
        }
    }

    fn set(px_ms: Option<u64>) -> Command {
        Command::Set {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            condition: None,
            px_ms,
        }
    }

    fn identity(connection_id: u64) -> ClientIdentity {
        ClientIdentity {
            client_id: Arc::from(format!("c{connection_id}")),
            principal: Arc::new(mqkv_broker::access::Principal::default()),
            grants: None,
            peer: "127.0.0.1:1".parse().expect("an address"),
            connection_id,
        }
    }

    /// A flood of registrations that has ended leaves no room behind: the maps shrink as
    /// observers close or stop, and registrations still open are untouched.
    #[test]
    fn the_room_of_ended_registrations_is_given_back() {
        let mut observers = Observers::default();
        for connection in 0..10u64 {
            let who = identity(connection);
            for k in 0..1000 {
                let key = Bytes::from(format!("{connection}/{k}"));
                assert!(observers.start(&who, &key, 10_000));
            }
        }
        let flooded = observers.by_key.capacity();
        assert!(flooded >= 10_000, "{flooded}");
        for connection in 1..10u64 {
            observers.connection_closed(connection);
        }
        let who = identity(0);
        for k in 0..900 {
            assert!(observers.stop(&who, &Bytes::from(format!("0/{k}"))));
        }
        assert_eq!(observers.by_key.len(), 100);
        assert!(
            observers.by_key.capacity() < 1000,
            "{}",
            observers.by_key.capacity()
        );
        let keys = &observers.by_connection[&0].keys;
        assert!(keys.capacity() < 1000, "{}", keys.capacity());
        assert!(observers.stop(&who, &Bytes::from_static(b"0/999")));
        assert!(!observers.stop(&who, &Bytes::from_static(b"0/0")));
    }

    /// Only a SET with a deadline can bring the earliest deadline forward, so only it wakes
    /// the expiry loop.
    #[test]
    fn only_a_set_with_a_deadline_wakes_the_expiry_loop() {
        assert!(sets_deadline(&request(set(Some(300)))));
        assert!(!sets_deadline(&request(set(None))));
        assert!(!sets_deadline(&request(Command::Del {
            key: Bytes::from_static(b"k")
        })));
        assert!(!sets_deadline(&Entry {
            now_ms: 1,
            op: Op::ExpireDue
        }));
    }
}
