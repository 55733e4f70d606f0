//! What a key observation and a pattern watch share: the local end of the notification stream,
//! and how a watch ends. The server registration of a key or a pattern is withdrawn when its
//! last local watch ends, by `unobserve` or, in the background, by being dropped.

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::{Command, Response};
use tokio::sync::mpsc;

use crate::client::Client;
use crate::connection::Shared;
use crate::error::{Error, Result};
use crate::observe::{KeyNotification, Registry};

/// What is watched.
#[derive(Clone)]
pub(crate) enum Target {
    /// One key (`KEYNOTIFY key`).
    Key(Bytes),
    /// The keys a glob pattern matches (`KEYNOTIFY pattern PATTERN`).
    Pattern(Bytes),
}

impl Target {
    /// The key or the pattern.
    pub(crate) fn name(&self) -> &Bytes {
        match self {
            Target::Key(name) | Target::Pattern(name) => name,
        }
    }

    /// Removes local watch `id`; true if it was the last of its key or pattern.
    fn remove(&self, registry: &mut Registry, id: u64) -> bool {
        match self {
            Target::Key(key) => registry.remove(key, id),
            Target::Pattern(pattern) => registry.patterns.remove(pattern, id),
        }
    }

    /// True if some local watch of the key or pattern is open.
    fn watched(&self, registry: &Registry) -> bool {
        match self {
            Target::Key(key) => registry.watches_key(key),
            Target::Pattern(pattern) => registry.patterns.contains(pattern),
        }
    }

    /// Withdraws the server registration: `KEYNOTIFY key STOP` or `KEYNOTIFY pattern PATTERN
    /// STOP`. An answer that there was none (the server restarted, say) is no error: the key or
    /// pattern is unwatched either way.
    pub(crate) async fn withdraw(&self, shared: &Shared, timeout: Duration) -> Result<()> {
        let command = match self {
            Target::Key(key) => Command::KeyNotify {
                key: key.clone(),
                stop: true,
            },
            Target::Pattern(pattern) => Command::KeyNotifyPattern {
                pattern: pattern.clone(),
                stop: true,
            },
        };
        match (self, shared.call(&command, None, timeout).await?.response) {
            (_, Response::Ok | Response::Integer(0)) | (Target::Key(_), Response::Nil) => Ok(()),
            (_, other) => Err(Error::protocol(
                "KEYNOTIFY",
                format!("unexpected answer {other:?}"),
            )),
        }
    }
}

/// One local watch: its notifications, and the client to withdraw it through.
pub(crate) struct Watch {
    target: Target,
    id: u64,
    rx: mpsc::UnboundedReceiver<KeyNotification>,
    /// `None` once unobserved.
    client: Option<Client>,
}

impl Watch {
    pub(crate) fn new(
        target: Target,
        id: u64,
        rx: mpsc::UnboundedReceiver<KeyNotification>,
        client: Client,
    ) -> Watch {
        Watch {
            target,
            id,
            rx,
            client: Some(client),
        }
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// The next change; `None` once the client is closed.
    pub(crate) async fn recv(&mut self) -> Option<KeyNotification> {
        self.rx.recv().await
    }

    /// The next change within `timeout` (`Ok(None)` if none came); `Err(Error::Closed)` once
    /// the client is closed.
    pub(crate) async fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<KeyNotification>> {
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Some(change)) => Ok(Some(change)),
            Ok(None) => Err(Error::Closed),
            Err(_) => Ok(None),
        }
    }

    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<KeyNotification>> {
        self.rx.poll_recv(cx)
    }

    /// Ends the watch, withdrawing the server registration if it was the last local one.
    pub(crate) async fn unobserve(mut self) -> Result<()> {
        let Some(client) = self.client.take() else {
            return Ok(());
        };
        let shared = client.shared();
        let _guard = shared.observe_lock.lock().await;
        let last = self
            .target
            .remove(&mut crate::observe::registry(shared), self.id);
        if last {
            self.target.withdraw(shared, client.timeout()).await?;
        }
        Ok(())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let last = self
            .target
            .remove(&mut crate::observe::registry(client.shared()), self.id);
        if !last {
            return;
        }
        // Withdraw the registration in the background, unless someone watches the key or
        // pattern again before the task gets the lock.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let target = self.target.clone();
        runtime.spawn(async move {
            let shared = client.shared();
            let _guard = shared.observe_lock.lock().await;
            let watched = target.watched(&crate::observe::registry(shared));
            if !watched {
                let _ = target.withdraw(shared, client.timeout()).await;
            }
        });
    }
}
