//! Key observations: KEYNOTIFY registrations, the notifications they
//! deliver, and how they survive reconnections.
//!
//! Invariants:
//! - The server holds at most one registration per key for this client,
//!   however many [`Observation`]s of that key exist locally; the
//!   registration is made by the first and withdrawn by the last.
//! - For every observed key the registry remembers the last state it
//!   reported (present with a version, or absent) and the newest version it
//!   saw. After a reconnection the registration is renewed with
//!   `KEYNOTIFY key SINCE version` (an mqkv extension), and the server sends
//!   every change made meanwhile as it happened. Where it cannot (no version
//!   seen yet, a server without the extension, or one that no longer keeps
//!   those changes), a fresh GET is compared with the remembered state; a
//!   difference is reported as a synthesized notification. Either way no
//!   change made while the client was away goes unreported.
//! - An answer is only compared with the remembered state if no
//!   notification for the key arrived after it: such a notification is
//!   newer than the answer and already reported.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::{Command, Hlc, Notification, Response};
use tokio::sync::mpsc;

use crate::client::{Client, Versioned};
use crate::connection::{Answer, Shared};
use crate::error::{Error, Result};
use crate::watch::{Target, Watch};

/// What happened to an observed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// The key was set to `value`.
    Set {
        /// The new value.
        value: Bytes,
    },
    /// The key was deleted (DEL, VDEL or expiry).
    Delete,
}

/// One change of an observed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNotification {
    /// The key that changed.
    pub key: Bytes,
    /// What happened.
    pub operation: Operation,
    /// The version: for SET the key's new version; for DELETE the server's
    /// clock at the deletion. For a synthesized DELETE, which the server
    /// never stamped, a timestamp of this client's clock taken when the
    /// deletion was noticed; it is later than every version seen before.
    pub version: Hlc,
    /// True if the server sent no notification for this change because the
    /// client was disconnected at the time; the client noticed the change
    /// when it reconnected and compared the key with what it last reported.
    pub synthesized: bool,
}

/// What the registry last reported for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Unknown,
    Present(Hlc),
    Absent,
}

struct Watched {
    subscribers: HashMap<u64, mpsc::UnboundedSender<KeyNotification>>,
    last: Seen,
    /// The newest version reported or read: of a SET, or of a deletion.
    version: Option<Hlc>,
    /// [`Registry::seq`] when a notification last updated `last`.
    updated_seq: u64,
}

/// Local observers per key. Lives behind a std mutex in [`Shared`]; never
/// held across an await.
#[derive(Default)]
pub(crate) struct Registry {
    keys: HashMap<Bytes, Watched>,
    /// Pattern watches (an mqkv extension).
    pub(crate) patterns: crate::pattern::Patterns,
    next_id: u64,
    /// Notifications handled so far.
    seq: u64,
    closed: bool,
}

impl Registry {
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// A new local subscriber id.
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Adds a local subscriber; true if the key had none (so the server
    /// registration must be made).
    fn add(&mut self, key: &Bytes, tx: mpsc::UnboundedSender<KeyNotification>) -> (u64, bool) {
        let id = self.next_id();
        let seq = self.seq;
        let watched = self.keys.entry(key.clone()).or_insert_with(|| Watched {
            subscribers: HashMap::new(),
            last: Seen::Unknown,
            version: None,
            updated_seq: seq,
        });
        let first = watched.subscribers.is_empty();
        watched.subscribers.insert(id, tx);
        (id, first)
    }

    /// Removes a local subscriber; true if it was the key's last one.
    pub(crate) fn remove(&mut self, key: &Bytes, id: u64) -> bool {
        let Some(watched) = self.keys.get_mut(key) else {
            return false;
        };
        if watched.subscribers.remove(&id).is_none() {
            return false;
        }
        if watched.subscribers.is_empty() {
            self.keys.remove(key);
            return true;
        }
        false
    }

    /// True if the key has a local subscriber.
    pub(crate) fn watches_key(&self, key: &Bytes) -> bool {
        self.keys.contains_key(key)
    }

    /// Every observed key, with the newest version seen of it.
    fn observed_keys(&self) -> Vec<(Bytes, Option<Hlc>)> {
        self.keys
            .iter()
            .map(|(key, watched)| (key.clone(), watched.version.clone()))
            .collect()
    }

    /// Hands a server notification to every local observer of the key, and to the pattern
    /// watches that match it.
    pub(crate) fn deliver(&mut self, key: Bytes, notification: Notification, version: Hlc) {
        self.seq += 1;
        let seq = self.seq;
        let operation = match notification {
            Notification::Set { value } => Operation::Set { value },
            Notification::Delete => Operation::Delete,
        };
        let change = KeyNotification {
            key,
            operation,
            version,
            synthesized: false,
        };
        if let Some(watched) = self.keys.get_mut(&change.key) {
            watched.last = match &change.operation {
                Operation::Set { .. } => Seen::Present(change.version.clone()),
                Operation::Delete => Seen::Absent,
            };
            watched.version = Some(change.version.clone());
            watched.updated_seq = seq;
            for tx in watched.subscribers.values() {
                let _ = tx.send(change.clone());
            }
        }
        self.patterns.deliver(&change);
    }

    /// Records `version` as seen for `key`, unless a newer one was.
    fn note_version(&mut self, key: &Bytes, version: &Hlc) {
        if let Some(watched) = self.keys.get_mut(key) {
            if watched.version.as_ref().is_none_or(|v| v < version) {
                watched.version = Some(version.clone());
            }
        }
    }

    /// Records the state of the key as read when the observation started.
    fn baseline(&mut self, key: &Bytes, current: Option<&Versioned>, answer_seq: u64) {
        let Some(watched) = self.keys.get_mut(key) else {
            return;
        };
        if watched.updated_seq > answer_seq {
            return;
        }
        watched.last = match current {
            Some(v) => {
                watched.version = Some(v.version.clone());
                Seen::Present(v.version.clone())
            }
            None => Seen::Absent,
        };
    }

    /// Compares the key as read after a reconnection with what was last
    /// reported and reports the difference.
    fn reconcile(&mut self, key: &Bytes, current: Option<Versioned>, answer_seq: u64, now: Hlc) {
        let Some(watched) = self.keys.get_mut(key) else {
            return;
        };
        if watched.updated_seq > answer_seq {
            return;
        }
        let change = match (current, &watched.last) {
            (Some(v), Seen::Present(last)) if *last >= v.version => None,
            (Some(v), _) => {
                watched.last = Seen::Present(v.version.clone());
                watched.version = Some(v.version.clone());
                Some((Operation::Set { value: v.value }, v.version))
            }
            (None, Seen::Present(_)) => {
                watched.last = Seen::Absent;
                Some((Operation::Delete, now))
            }
            (None, _) => {
                watched.last = Seen::Absent;
                None
            }
        };
        if let Some((operation, version)) = change {
            let change = KeyNotification {
                key: key.clone(),
                operation,
                version,
                synthesized: true,
            };
            for tx in watched.subscribers.values() {
                let _ = tx.send(change.clone());
            }
        }
    }

    /// Ends every observation stream.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.keys.clear();
        self.patterns.clear();
    }
}

/// The observation registry of a client's connection.
pub(crate) fn registry(shared: &Shared) -> std::sync::MutexGuard<'_, Registry> {
    shared.observers.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stream of changes to one key, from [`Client::observe`].
///
/// Receive with [`Observation::recv`] or use it as a
/// [`Stream`](futures_core::Stream). End it with [`Observation::unobserve`]
/// (or [`Client::unobserve`]); merely dropping it also withdraws the
/// registration, in the background. Notifications are buffered without
/// limit until read.
pub struct Observation {
    watch: Watch,
    initial: Option<Versioned>,
}

impl std::fmt::Debug for Observation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observation")
            .field("key", self.key())
            .field("initial", &self.initial)
            .finish_non_exhaustive()
    }
}

impl Observation {
    /// The observed key.
    ///
    /// ```
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let observation = client.observe("door").await?;
    /// assert_eq!(observation.key(), "door");
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &Bytes {
        self.watch.target().name()
    }

    /// The key's value and version when the observation started (`None` if
    /// it did not exist). Every change after that arrives as a notification.
    ///
    /// ```
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let observation = client.observe("door").await?;
    /// if let Some(now) = observation.initial() {
    ///     println!("door is {:?} (version {})", now.value, now.version);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn initial(&self) -> Option<&Versioned> {
        self.initial.as_ref()
    }

    /// The next change; `None` once the client is closed.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut changes = client.observe("door").await?;
    /// while let Some(change) = changes.recv().await {
    ///     println!("{:?} at {}", change.operation, change.version);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv(&mut self) -> Option<KeyNotification> {
        self.watch.recv().await
    }

    /// Like [`Observation::recv`], giving up after `timeout` with `Ok(None)`;
    /// `Err(Error::Closed)` once the client is closed.
    ///
    /// ```
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut observation = client.observe("door").await?;
    /// match observation.recv_timeout(std::time::Duration::from_secs(5)).await? {
    ///     Some(change) => println!("{:?}", change.operation),
    ///     None => println!("quiet for 5 s"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<KeyNotification>> {
        self.watch.recv_timeout(timeout).await
    }

    /// Stops observing: withdraws the server registration if this was the
    /// key's last local observation.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let observation = client.observe("door").await?;
    /// observation.unobserve().await?;
    /// # Ok(()) }
    /// ```
    pub async fn unobserve(self) -> Result<()> {
        self.watch.unobserve().await
    }
}

impl futures_core::Stream for Observation {
    type Item = KeyNotification;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<KeyNotification>> {
        self.watch.poll_recv(cx)
    }
}

/// `KEYNOTIFY key SINCE version`: the server sends the changes after `since` as notifications
/// before it answers. False when it cannot: the caller then reads the key instead.
async fn resume(shared: &Shared, key: &Bytes, since: &Hlc, timeout: Duration) -> Result<bool> {
    let command = Command::KeyNotifySince {
        key: key.clone(),
        since: since.clone(),
    };
    resume_with(shared, &command, timeout).await
}

/// Sends a `KEYNOTIFY ... SINCE` request (of a key or a pattern). False when the server cannot
/// replay: it no longer keeps those changes, or does not know the extension.
pub(crate) async fn resume_with(
    shared: &Shared,
    command: &Command,
    timeout: Duration,
) -> Result<bool> {
    match shared.call(command, None, timeout).await {
        Ok(answer) if answer.response == Response::Ok => Ok(true),
        Ok(answer) => Err(Error::protocol(
            "KEYNOTIFY",
            format!("unexpected answer {:?}", answer.response),
        )),
        Err(Error::Server(crate::ServerError::Known(
            mqkv_protocol::ErrorKind::HistoryCompacted
            | mqkv_protocol::ErrorKind::SyntaxError
            | mqkv_protocol::ErrorKind::WrongNumberOfArguments,
        ))) => Ok(false),
        Err(e) => Err(e),
    }
}

async fn start(shared: &Shared, key: &Bytes, timeout: Duration) -> Result<()> {
    let command = Command::KeyNotify {
        key: key.clone(),
        stop: false,
    };
    let answer = shared.call(&command, None, timeout).await?;
    match answer.response {
        Response::Ok => Ok(()),
        other => Err(Error::protocol(
            "KEYNOTIFY",
            format!("unexpected answer {other:?}"),
        )),
    }
}

/// Opens an observation (see [`Client::observe`]).
pub(crate) async fn observe(client: &Client, key: Bytes) -> Result<Observation> {
    let shared = client.shared();
    let _guard = shared.observe_lock.lock().await;
    if registry(shared).closed {
        return Err(Error::Closed);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let (id, first) = registry(shared).add(&key, tx);
    let read = async {
        if first {
            start(shared, &key, client.timeout()).await?;
        }
        match read_key(client, &key).await {
            Ok(read) => Ok(read),
            Err(e) => {
                if first {
                    let _ = Target::Key(key.clone())
                        .withdraw(shared, client.timeout())
                        .await;
                }
                Err(e)
            }
        }
    }
    .await;
    match read {
        Ok((current, seq)) => {
            if first {
                registry(shared).baseline(&key, current.as_ref(), seq);
            }
            Ok(Observation {
                watch: Watch::new(Target::Key(key), id, rx, client.clone()),
                initial: current,
            })
        }
        Err(e) => {
            registry(shared).remove(&key, id);
            Err(e)
        }
    }
}

/// Opens an observation that first receives the changes after `since` (see
/// [`Client::observe_since`]).
pub(crate) async fn observe_since(client: &Client, key: Bytes, since: Hlc) -> Result<Observation> {
    let shared = client.shared();
    let _guard = shared.observe_lock.lock().await;
    if registry(shared).closed {
        return Err(Error::Closed);
    }
    if registry(shared).watches_key(&key) {
        return Err(Error::InvalidArgument(
            "the key is already observed by this client: resume before observing it".into(),
        ));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let (id, _) = registry(shared).add(&key, tx);
    registry(shared).note_version(&key, &since);
    match resume(shared, &key, &since, client.timeout()).await {
        Ok(true) => Ok(Observation {
            watch: Watch::new(Target::Key(key), id, rx, client.clone()),
            initial: None,
        }),
        Ok(false) => {
            registry(shared).remove(&key, id);
            Err(Error::Server(crate::ServerError::Known(
                mqkv_protocol::ErrorKind::HistoryCompacted,
            )))
        }
        Err(e) => {
            registry(shared).remove(&key, id);
            Err(e)
        }
    }
}

/// GET with the notification sequence number of its answer.
async fn read_key(client: &Client, key: &Bytes) -> Result<(Option<Versioned>, u64)> {
    let answer = client
        .shared()
        .call(&Command::Get { key: key.clone() }, None, client.timeout())
        .await?;
    let seq = answer.seq;
    Ok((crate::client::get_result(answer)?, seq))
}

/// Renews every registration after each reconnection and reports what
/// changed meanwhile. Runs until the client closes.
pub(crate) async fn resync_task(shared: Arc<Shared>) {
    let mut link = shared.link();
    let mut synced = link.borrow().epoch;
    loop {
        let state = match link
            .wait_for(|s| s.closed || (s.ready && s.epoch != synced))
            .await
        {
            Ok(state) => state.clone(),
            Err(_) => return,
        };
        if state.closed {
            return;
        }
        match resync(&shared).await {
            Ok(()) => synced = state.epoch,
            Err(Error::Closed) => return,
            Err(error) => {
                tracing::debug!(%error, "renewing observations failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

async fn resync(shared: &Arc<Shared>) -> Result<()> {
    let _guard = shared.observe_lock.lock().await;
    let keys = registry(shared).observed_keys();
    let patterns = registry(shared).patterns.patterns();
    let timeout = shared.default_timeout;
    for (pattern, newest) in patterns {
        if let Some(since) = newest {
            if crate::pattern::resume(shared, &pattern, &since, timeout).await? {
                continue;
            }
        }
        crate::pattern::register(shared, &pattern, timeout).await?;
    }
    for (key, seen) in keys {
        if let Some(since) = seen {
            if resume(shared, &key, &since, timeout).await? {
                continue;
            }
        }
        start(shared, &key, timeout).await?;
        let answer: Answer = shared
            .call(&Command::Get { key: key.clone() }, None, timeout)
            .await?;
        let seq = answer.seq;
        let current = crate::client::get_result(answer)?;
        let now = shared.clock.tick();
        registry(shared).reconcile(&key, current, seq, now);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(ms: u64) -> Hlc {
        Hlc::new(ms, 0, "srv")
    }

    fn present(value: &'static str, ms: u64) -> Option<Versioned> {
        Some(Versioned {
            value: Bytes::from_static(value.as_bytes()),
            version: v(ms),
        })
    }

    fn registry_with(key: &Bytes) -> (Registry, mpsc::UnboundedReceiver<KeyNotification>) {
        let mut r = Registry::default();
        let (tx, rx) = mpsc::unbounded_channel();
        r.add(key, tx);
        (r, rx)
    }

    #[test]
    fn first_and_last_subscriber_are_reported() {
        let key = Bytes::from_static(b"k");
        let mut r = Registry::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let (a, first_a) = r.add(&key, tx.clone());
        let (b, first_b) = r.add(&key, tx);
        assert!(first_a && !first_b);
        assert!(!r.remove(&key, a));
        assert!(r.remove(&key, b));
        assert!(!r.remove(&key, b));
    }

    #[test]
    fn reconnect_reports_a_set_missed_while_away() {
        let key = Bytes::from_static(b"k");
        let (mut r, mut rx) = registry_with(&key);
        r.baseline(&key, present("a", 1).as_ref(), 0);
        r.reconcile(&key, present("b", 2), 0, v(3));
        let change = rx.try_recv().unwrap();
        assert_eq!(
            change.operation,
            Operation::Set {
                value: Bytes::from_static(b"b")
            }
        );
        assert_eq!(change.version, v(2));
        assert!(change.synthesized);
        // Nothing more changed: a second reconnection reports nothing.
        r.reconcile(&key, present("b", 2), 0, v(4));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn reconnect_reports_a_delete_missed_while_away() {
        let key = Bytes::from_static(b"k");
        let (mut r, mut rx) = registry_with(&key);
        r.baseline(&key, present("a", 1).as_ref(), 0);
        r.reconcile(&key, None, 0, v(9));
        let change = rx.try_recv().unwrap();
        assert_eq!(change.operation, Operation::Delete);
        assert_eq!(change.version, v(9));
        assert!(change.synthesized);
        r.reconcile(&key, None, 0, v(10));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn unchanged_keys_report_nothing() {
        let key = Bytes::from_static(b"k");
        let (mut r, mut rx) = registry_with(&key);
        r.baseline(&key, None, 0);
        r.reconcile(&key, None, 0, v(9));
        r.baseline(&key, present("a", 5).as_ref(), 0);
        r.reconcile(&key, present("a", 5), 0, v(9));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn answers_older_than_a_notification_are_ignored() {
        let key = Bytes::from_static(b"k");
        let (mut r, mut rx) = registry_with(&key);
        r.baseline(&key, present("a", 1).as_ref(), 0);
        let answer_seq = r.seq();
        // A SET arrives after the GET answer was handled...
        r.deliver(
            key.clone(),
            Notification::Set {
                value: Bytes::from_static(b"c"),
            },
            v(7),
        );
        assert!(!rx.try_recv().unwrap().synthesized);
        // ...so the GET's "absent" is stale and must not become a DELETE.
        r.reconcile(&key, None, answer_seq, v(8));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn notifications_reach_every_subscriber_of_the_key_only() {
        let key = Bytes::from_static(b"k");
        let other = Bytes::from_static(b"other");
        let mut r = Registry::default();
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        r.add(&key, tx1);
        r.add(&key, tx2);
        r.deliver(other, Notification::Delete, v(1));
        r.deliver(key.clone(), Notification::Delete, v(2));
        assert_eq!(rx1.try_recv().unwrap().version, v(2));
        assert_eq!(rx2.try_recv().unwrap().version, v(2));
        assert!(rx1.try_recv().is_err());
    }
}
