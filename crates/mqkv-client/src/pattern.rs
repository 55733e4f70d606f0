//! Pattern watches (an mqkv extension): `KEYNOTIFY pattern PATTERN` registrations and the
//! notifications of every key they match.
//!
//! Invariants:
//! - The server holds at most one registration per pattern for this client, however many
//!   [`PatternObservation`]s of it exist locally; the first makes it, the last withdraws it.
//! - After a reconnection every pattern is registered again, with `SINCE` the newest version
//!   it reported, so the changes made while the client was away arrive first. If the server
//!   no longer keeps them, the pattern is registered afresh and those changes go unreported.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::{Command, GlobPattern, Hlc, Response};
use tokio::sync::mpsc;

use crate::client::Client;
use crate::connection::Shared;
use crate::error::{Error, Result};
use crate::observe::KeyNotification;
use crate::watch::{Target, Watch};

/// The local subscribers of one pattern.
struct Watched {
    glob: GlobPattern,
    subscribers: HashMap<u64, mpsc::UnboundedSender<KeyNotification>>,
    /// The newest version reported.
    newest: Option<Hlc>,
}

/// Local pattern watches, part of the observation registry.
#[derive(Default)]
pub(crate) struct Patterns {
    by_pattern: HashMap<Bytes, Watched>,
}

impl Patterns {
    /// Adds a subscriber with id `id`; true if the pattern had none.
    fn add(
        &mut self,
        pattern: &Bytes,
        id: u64,
        tx: mpsc::UnboundedSender<KeyNotification>,
    ) -> bool {
        let watched = self
            .by_pattern
            .entry(pattern.clone())
            .or_insert_with(|| Watched {
                glob: GlobPattern::new(pattern),
                subscribers: HashMap::new(),
                newest: None,
            });
        let first = watched.subscribers.is_empty();
        watched.subscribers.insert(id, tx);
        first
    }

    /// Removes a subscriber; true if it was the pattern's last.
    pub(crate) fn remove(&mut self, pattern: &Bytes, id: u64) -> bool {
        let Some(watched) = self.by_pattern.get_mut(pattern) else {
            return false;
        };
        if watched.subscribers.remove(&id).is_none() {
            return false;
        }
        if watched.subscribers.is_empty() {
            self.by_pattern.remove(pattern);
            return true;
        }
        false
    }

    pub(crate) fn contains(&self, pattern: &Bytes) -> bool {
        self.by_pattern.contains_key(pattern)
    }

    /// Every pattern watched, with the newest version it reported.
    pub(crate) fn patterns(&self) -> Vec<(Bytes, Option<Hlc>)> {
        self.by_pattern
            .iter()
            .map(|(pattern, watched)| (pattern.clone(), watched.newest.clone()))
            .collect()
    }

    /// Hands a change to every subscriber of a pattern that matches its key.
    pub(crate) fn deliver(&mut self, change: &KeyNotification) {
        for watched in self.by_pattern.values_mut() {
            if watched.glob.matches(&change.key) {
                if watched.newest.as_ref().is_none_or(|n| *n < change.version) {
                    watched.newest = Some(change.version.clone());
                }
                for tx in watched.subscribers.values() {
                    let _ = tx.send(change.clone());
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.by_pattern.clear();
    }
}

/// A stream of the changes of every key a glob pattern matches, from
/// [`Client::observe_pattern`].
///
/// Receive with [`PatternObservation::recv`] or use it as a
/// [`Stream`](futures_core::Stream); end it with [`PatternObservation::unobserve`] (dropping it
/// also withdraws the registration, in the background). Notifications are buffered without
/// limit until read.
pub struct PatternObservation {
    watch: Watch,
}

impl std::fmt::Debug for PatternObservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatternObservation")
            .field("pattern", self.pattern())
            .finish_non_exhaustive()
    }
}

impl PatternObservation {
    /// The observed pattern.
    pub fn pattern(&self) -> &Bytes {
        self.watch.target().name()
    }

    /// The next change of a matching key; `None` once the client is closed.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut sensors = client.observe_pattern("sensors/*").await?;
    /// while let Some(change) = sensors.recv().await {
    ///     println!("{:?}: {:?}", change.key, change.operation);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn recv(&mut self) -> Option<KeyNotification> {
        self.watch.recv().await
    }

    /// Like [`PatternObservation::recv`], giving up after `timeout` with `Ok(None)`;
    /// `Err(Error::Closed)` once the client is closed.
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<KeyNotification>> {
        self.watch.recv_timeout(timeout).await
    }

    /// Stops watching: withdraws the server registration if this was the pattern's last
    /// local watch.
    pub async fn unobserve(self) -> Result<()> {
        self.watch.unobserve().await
    }
}

impl futures_core::Stream for PatternObservation {
    type Item = KeyNotification;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<KeyNotification>> {
        self.watch.poll_recv(cx)
    }
}

/// `KEYNOTIFY pattern PATTERN SINCE version`: the server sends the changes after `since` of
/// the keys the pattern matches before it answers. False when it cannot replay them.
pub(crate) async fn resume(
    shared: &Shared,
    pattern: &Bytes,
    since: &Hlc,
    timeout: Duration,
) -> Result<bool> {
    let command = Command::KeyNotifyPatternSince {
        pattern: pattern.clone(),
        since: since.clone(),
    };
    crate::observe::resume_with(shared, &command, timeout).await
}

/// `KEYNOTIFY pattern PATTERN`: registers a pattern watch.
pub(crate) async fn register(shared: &Shared, pattern: &Bytes, timeout: Duration) -> Result<()> {
    let command = Command::KeyNotifyPattern {
        pattern: pattern.clone(),
        stop: false,
    };
    match shared.call(&command, None, timeout).await?.response {
        Response::Ok => Ok(()),
        other => Err(Error::protocol(
            "KEYNOTIFY",
            format!("unexpected answer {other:?}"),
        )),
    }
}

/// Opens a pattern watch (see [`Client::observe_pattern`]), first receiving the changes after
/// `since` when it is given ([`Client::observe_pattern_since`]).
pub(crate) async fn observe(
    client: &Client,
    pattern: Bytes,
    since: Option<Hlc>,
) -> Result<PatternObservation> {
    let shared = client.shared();
    let _guard = shared.observe_lock.lock().await;
    let (tx, rx) = mpsc::unbounded_channel();
    let (id, first) = {
        let mut registry = crate::observe::registry(shared);
        if registry.is_closed() {
            return Err(Error::Closed);
        }
        let id = registry.next_id();
        (id, registry.patterns.add(&pattern, id, tx))
    };
    let registered = match (&since, first) {
        (Some(since), _) => match resume(shared, &pattern, since, client.timeout()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Server(crate::ServerError::Known(
                mqkv_protocol::ErrorKind::HistoryCompacted,
            ))),
            Err(e) => Err(e),
        },
        (None, true) => register(shared, &pattern, client.timeout()).await,
        (None, false) => Ok(()),
    };
    if let Err(e) = registered {
        crate::observe::registry(shared)
            .patterns
            .remove(&pattern, id);
        return Err(e);
    }
    Ok(PatternObservation {
        watch: Watch::new(Target::Pattern(pattern), id, rx, client.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::Operation;
    use mqkv_protocol::Hlc;

    fn change(key: &'static str) -> KeyNotification {
        KeyNotification {
            key: Bytes::from_static(key.as_bytes()),
            operation: Operation::Delete,
            version: Hlc::new(1, 0, "n"),
            synthesized: false,
        }
    }

    #[test]
    fn a_change_reaches_the_subscribers_of_matching_patterns() {
        let mut p = Patterns::default();
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        let sensors = Bytes::from_static(b"sensors/*");
        assert!(p.add(&sensors, 1, tx1));
        assert!(p.add(&Bytes::from_static(b"doors/*"), 2, tx2));
        p.deliver(&change("sensors/a"));
        assert_eq!(&rx1.try_recv().expect("matched").key[..], b"sensors/a");
        assert!(rx2.try_recv().is_err());
        let (tx3, _rx3) = mpsc::unbounded_channel();
        assert!(
            !p.add(&sensors, 3, tx3),
            "a second subscriber of the pattern"
        );
        assert!(!p.remove(&sensors, 1));
        assert!(p.remove(&sensors, 3), "the last one");
        assert_eq!(p.patterns(), vec![(Bytes::from_static(b"doors/*"), None)]);
    }
}
