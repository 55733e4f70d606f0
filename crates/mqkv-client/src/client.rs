//! The typed state store API.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::{Command, Hlc, Response};
use tokio::sync::watch;

use crate::connection::{Answer, LinkState, Shared};
use crate::error::{Error, Result};
use crate::observe::{self, Observation};
use crate::options::{ClientOptions, DelOptions, SetOptions};
use crate::scan::KeyPager;

/// A value together with the version the server gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The stored bytes.
    pub value: Bytes,
    /// The key's version: the `__ts` of the SET that stored the value.
    pub version: Hlc,
}

/// The outcome of a SET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOutcome {
    /// The value was stored.
    Applied {
        /// The key's new version. After a lease SET this is the fencing token.
        version: Hlc,
    },
    /// The NX / NEX condition failed; nothing changed.
    NotApplied {
        /// The version of the value that is stored, when the server says.
        current_version: Option<Hlc>,
    },
}

impl SetOutcome {
    /// True if the value was stored.
    ///
    /// ```
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let applied = client.set("k", "v").await?.is_applied();
    /// assert!(applied);
    /// # Ok(()) }
    /// ```
    pub fn is_applied(&self) -> bool {
        matches!(self, SetOutcome::Applied { .. })
    }

    /// The new version if applied, else the stored one (if known).
    ///
    /// ```
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let outcome = client.set("k", "v").await?;
    /// println!("version {:?}", outcome.version());
    /// # Ok(()) }
    /// ```
    pub fn version(&self) -> Option<&Hlc> {
        match self {
            SetOutcome::Applied { version } => Some(version),
            SetOutcome::NotApplied { current_version } => current_version.as_ref(),
        }
    }
}

/// The outcome of a DEL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelOutcome {
    /// The key existed and is gone.
    Deleted {
        /// The version of the deletion, when the server says.
        version: Option<Hlc>,
    },
    /// There was no such key.
    NotFound,
    /// The key's version was not the one [`crate::DelOptions::if_version`] named: it is
    /// still there, at `current_version`.
    NotApplied {
        /// The key's version now.
        current_version: Option<Hlc>,
    },
}

/// The outcome of a VDEL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VDelOutcome {
    /// The key held the given value and is gone.
    Deleted {
        /// The version of the deletion, when the server says.
        version: Option<Hlc>,
    },
    /// There was no such key.
    NotFound,
    /// The key holds a different value; nothing changed.
    ValueMismatch {
        /// The version of the stored value, when the server says.
        current_version: Option<Hlc>,
    },
}

/// The connection as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionStatus {
    /// Connected and subscribed. `connections` counts the connections made
    /// so far, so a change of it means a reconnection happened.
    Connected {
        /// 1 for the first connection, 2 after the first reconnection, ...
        connections: u64,
    },
    /// The connection was lost; the client keeps trying to reconnect.
    Reconnecting,
    /// The client was shut down.
    Closed,
}

/// Follows the [`ConnectionStatus`] of a client; from [`Client::status`].
#[derive(Debug, Clone)]
pub struct StatusWatch {
    rx: watch::Receiver<LinkState>,
}

impl StatusWatch {
    /// The status now.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// if let mqkv_client::ConnectionStatus::Connected { connections } = client.status().current() {
    ///     println!("connection #{connections}");
    /// }
    /// # }
    /// ```
    pub fn current(&self) -> ConnectionStatus {
        status_of(&self.rx.borrow())
    }

    /// Waits for the status to change and returns the new one.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) {
    /// let mut status = client.status();
    /// loop {
    ///     let now = status.changed().await;
    ///     eprintln!("connection: {now:?}");
    ///     if now == mqkv_client::ConnectionStatus::Closed {
    ///         break;
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn changed(&mut self) -> ConnectionStatus {
        let before = self.current();
        loop {
            if self.rx.changed().await.is_err() {
                return ConnectionStatus::Closed;
            }
            let now = self.current();
            if now != before {
                return now;
            }
        }
    }
}

fn status_of(state: &LinkState) -> ConnectionStatus {
    if state.closed {
        ConnectionStatus::Closed
    } else if state.ready {
        ConnectionStatus::Connected {
            connections: state.epoch,
        }
    } else {
        ConnectionStatus::Reconnecting
    }
}

/// Shuts the connection down when the last [`Client`] clone goes away.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}

/// A state store client over one MQTT 5 connection.
///
/// Cheap to clone; every clone shares the connection, which is closed when
/// the last clone (and the last [`Observation`], lease renewal, ...) is
/// dropped, or by [`Client::disconnect`]. The connection is re-established
/// automatically when it drops; requests in flight are sent again.
///
/// ```no_run
/// use mqkv_client::{Client, ClientOptions};
///
/// # async fn demo() -> Result<(), mqkv_client::Error> {
/// let client = Client::connect(ClientOptions::new("127.0.0.1", 1883)).await?;
/// client.set("greeting", "hello").await?;
/// let entry = client.get("greeting").await?.expect("just set");
/// assert_eq!(entry.value, "hello");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("client_id", &self.client_id())
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn non_empty(key: Bytes, what: &str) -> Result<Bytes> {
    if key.is_empty() {
        Err(Error::InvalidArgument(format!(
            "the {what} must not be empty"
        )))
    } else {
        Ok(key)
    }
}

/// Milliseconds for `PX`, refusing what would be sent as `PX 0`.
fn px_ms(ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(Error::InvalidArgument(
            "an expiry must be at least 1 ms".into(),
        ));
    }
    Ok(ms)
}

/// Reads a GET answer.
pub(crate) fn get_result(answer: Answer) -> Result<Option<Versioned>> {
    match answer.response {
        Response::Value(value) => {
            let version = answer
                .version
                .ok_or_else(|| Error::protocol("GET", "a value without a version (__ts)"))?;
            Ok(Some(Versioned { value, version }))
        }
        // `:0` is what the Rust SDK also reads as "not found".
        Response::Nil | Response::Integer(0) => Ok(None),
        other => Err(Error::protocol(
            "GET",
            format!("unexpected answer {other:?}"),
        )),
    }
}

impl Client {
    /// Connects to the broker and subscribes to the response and
    /// notification topics. Returns once the client can send requests.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use mqkv_client::{Client, ClientOptions};
    ///
    /// # async fn demo() -> Result<(), mqkv_client::Error> {
    /// let options = ClientOptions::new("127.0.0.1", 1883)
    ///     .client_id("inventory-service")
    ///     .request_timeout(Duration::from_secs(3));
    /// let client = Client::connect(options).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(options: ClientOptions) -> Result<Client> {
        let shared = Shared::connect(&options).await?;
        tokio::spawn(observe::resync_task(shared.clone()));
        Ok(Client {
            timeout: options.request_timeout,
            handle: Arc::new(Handle { shared }),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// The MQTT client id, which is also the observer identity.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// println!("observing as {}", client.client_id());
    /// # }
    /// ```
    pub fn client_id(&self) -> &str {
        &self.shared().client_id
    }

    /// The request timeout of this handle.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let quick = client.with_timeout(std::time::Duration::from_secs(1));
    /// assert_eq!(quick.timeout(), std::time::Duration::from_secs(1));
    /// # }
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle to the same connection whose requests use `timeout`.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let quick = client.with_timeout(Duration::from_millis(500));
    /// let maybe = quick.get("config").await?;
    /// # Ok(()) }
    /// ```
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client {
            handle: self.handle.clone(),
            timeout,
        }
    }

    /// Follows the connection status (connected, reconnecting, closed).
    ///
    /// ```no_run
    /// # fn demo(client: mqkv_client::Client) {
    /// println!("{:?}", client.status().current());
    /// # }
    /// ```
    pub fn status(&self) -> StatusWatch {
        StatusWatch {
            rx: self.shared().link(),
        }
    }

    /// A fresh timestamp of this client's hybrid logical clock, the kind
    /// sent as `__ts`. Later than every version this client has seen.
    ///
    /// ```no_run
    /// # fn demo(client: mqkv_client::Client) {
    /// let now = client.timestamp();
    /// println!("{now}");
    /// # }
    /// ```
    pub fn timestamp(&self) -> Hlc {
        self.shared().clock.tick()
    }

    async fn call(&self, command: Command, fencing_token: Option<&Hlc>) -> Result<Answer> {
        self.shared()
            .call(&command, fencing_token, self.timeout)
            .await
    }

    /// `GET`: the value and version of `key`, or `None` if it does not exist.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// match client.get("config").await? {
    ///     Some(entry) => println!("{:?} (version {})", entry.value, entry.version),
    ///     None => println!("not set"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn get(&self, key: impl Into<Bytes>) -> Result<Option<Versioned>> {
        let key = non_empty(key.into(), "key")?;
        get_result(self.call(Command::Get { key }, None).await?)
    }

    /// `MGET` (an mqkv extension): the values and versions of up to
    /// [`mqkv_protocol::MAX_MGET_KEYS`] keys, read at one moment; `None` for a key that does
    /// not exist.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let [a, b] = <[_; 2]>::try_from(client.mget(["a", "b"]).await?).unwrap();
    /// println!("{a:?} {b:?}");
    /// # Ok(()) }
    /// ```
    pub async fn mget<K: Into<Bytes>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<Vec<Option<Versioned>>> {
        let keys = keys
            .into_iter()
            .map(|k| non_empty(k.into(), "key"))
            .collect::<Result<Vec<_>>>()?;
        if keys.is_empty() || keys.len() > mqkv_protocol::MAX_MGET_KEYS {
            return Err(Error::InvalidArgument(format!(
                "MGET takes 1 to {} keys",
                mqkv_protocol::MAX_MGET_KEYS
            )));
        }
        let n = keys.len();
        match self.call(Command::MGet { keys }, None).await?.response {
            Response::Values(values) if values.len() == n => Ok(values
                .into_iter()
                .map(|v| v.map(|(value, version)| Versioned { value, version }))
                .collect()),
            other => Err(Error::protocol(
                "MGET",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// `SET` without conditions: stores `value` under `key`.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let outcome = client.set("config", "v2").await?;
    /// println!("stored as version {:?}", outcome.version());
    /// # Ok(()) }
    /// ```
    pub async fn set(&self, key: impl Into<Bytes>, value: impl Into<Bytes>) -> Result<SetOutcome> {
        self.set_with(key, value, &SetOptions::default()).await
    }

    /// `SET` with options: `NX` / `NEX`, `PX` and a fencing token.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use mqkv_client::{SetOptions, SetOutcome};
    ///
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let options = SetOptions::new().nx().expires_in(Duration::from_secs(30));
    /// match client.set_with("job/42", "worker-a", &options).await? {
    ///     SetOutcome::Applied { version } => println!("claimed at {version}"),
    ///     SetOutcome::NotApplied { .. } => println!("someone else has it"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn set_with(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        options: &SetOptions,
    ) -> Result<SetOutcome> {
        let command = Command::Set {
            key: non_empty(key.into(), "key")?,
            value: value.into(),
            condition: options.condition.clone(),
            px_ms: options.expires_in.map(px_ms).transpose()?,
        };
        let answer = self.call(command, options.fencing_token.as_ref()).await?;
        match answer.response {
            Response::Ok => {
                let version = answer
                    .version
                    .ok_or_else(|| Error::protocol("SET", "applied without a version (__ts)"))?;
                Ok(SetOutcome::Applied { version })
            }
            Response::NotApplied => Ok(SetOutcome::NotApplied {
                current_version: answer.version,
            }),
            other => Err(Error::protocol(
                "SET",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// `DEL`: deletes `key`.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// use mqkv_client::DelOutcome;
    /// if client.del("config").await? == DelOutcome::NotFound {
    ///     println!("nothing to delete");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn del(&self, key: impl Into<Bytes>) -> Result<DelOutcome> {
        self.del_with(key, &DelOptions::default()).await
    }

    /// `DEL` with a fencing token.
    ///
    /// ```no_run
    /// use mqkv_client::DelOptions;
    /// # async fn demo(client: mqkv_client::Client, token: mqkv_protocol::Hlc) -> Result<(), mqkv_client::Error> {
    /// client.del_with("protected", &DelOptions::new().fencing_token(token)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn del_with(
        &self,
        key: impl Into<Bytes>,
        options: &DelOptions,
    ) -> Result<DelOutcome> {
        let key = non_empty(key.into(), "key")?;
        let command = match &options.if_version {
            Some(version) => Command::DelIfVersion {
                key,
                version: version.clone(),
            },
            None => Command::Del { key },
        };
        let answer = self.call(command, options.fencing_token.as_ref()).await?;
        match answer.response {
            Response::Integer(n) if n > 0 => Ok(DelOutcome::Deleted {
                version: answer.version,
            }),
            Response::Integer(0) | Response::Nil => Ok(DelOutcome::NotFound),
            Response::NotApplied => Ok(DelOutcome::NotApplied {
                current_version: answer.version,
            }),
            other => Err(Error::protocol(
                "DEL",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// `VDEL`: deletes `key` only if it holds `value`.
    ///
    /// ```no_run
    /// use mqkv_client::VDelOutcome;
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// match client.vdel("leader", "node-1").await? {
    ///     VDelOutcome::Deleted { .. } => println!("stepped down"),
    ///     VDelOutcome::ValueMismatch { .. } => println!("someone else leads"),
    ///     VDelOutcome::NotFound => println!("nobody leads"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn vdel(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) -> Result<VDelOutcome> {
        self.vdel_with(key, value, &DelOptions::default()).await
    }

    /// `VDEL` with a fencing token.
    ///
    /// ```no_run
    /// use mqkv_client::DelOptions;
    /// # async fn demo(client: mqkv_client::Client, token: mqkv_protocol::Hlc) -> Result<(), mqkv_client::Error> {
    /// client.vdel_with("protected", "old", &DelOptions::new().fencing_token(token)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn vdel_with(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        options: &DelOptions,
    ) -> Result<VDelOutcome> {
        let command = Command::VDel {
            key: non_empty(key.into(), "key")?,
            value: value.into(),
        };
        let answer = self.call(command, options.fencing_token.as_ref()).await?;
        match answer.response {
            Response::Integer(n) if n > 0 => Ok(VDelOutcome::Deleted {
                version: answer.version,
            }),
            Response::Integer(0) | Response::Nil => Ok(VDelOutcome::NotFound),
            Response::NotApplied => Ok(VDelOutcome::ValueMismatch {
                current_version: answer.version,
            }),
            other => Err(Error::protocol(
                "VDEL",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// `KEYNOTIFY`: starts observing `key` (which need not exist) and
    /// returns the stream of its changes. The observation is renewed after
    /// every reconnection, and changes made while the client was away are
    /// reported as synthesized notifications.
    ///
    /// ```no_run
    /// use mqkv_client::Operation;
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut door = client.observe("door").await?;
    /// println!("now: {:?}", door.initial());
    /// while let Some(change) = door.recv().await {
    ///     match change.operation {
    ///         Operation::Set { value } => println!("door = {value:?} ({})", change.version),
    ///         Operation::Delete => println!("door removed"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe(&self, key: impl Into<Bytes>) -> Result<Observation> {
        let key = non_empty(key.into(), "key")?;
        observe::observe(self, key).await
    }

    /// `KEYNOTIFY key SINCE version` (an mqkv extension): observes `key`, first receiving every
    /// change made after `since` (a version this application saw before, such as the last one
    /// it processed), in order, then the live ones, with no gap and no duplicate between them.
    /// Fails with [`crate::ErrorKind::HistoryCompacted`] when the server no longer keeps
    /// those changes: read the key again then.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client, last: mqkv_client::Hlc) -> Result<(), mqkv_client::Error> {
    /// let mut door = client.observe_since("door", last).await?;
    /// while let Some(change) = door.recv().await {
    ///     println!("{:?} at {}", change.operation, change.version);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe_since(&self, key: impl Into<Bytes>, since: Hlc) -> Result<Observation> {
        let key = non_empty(key.into(), "key")?;
        observe::observe_since(self, key, since).await
    }

    /// `KEYNOTIFY pattern PATTERN` (an mqkv extension): a stream of the changes of every key
    /// the glob `pattern` matches (`*`, `?`, `[a-z]`, `[!x]`), including keys that do not
    /// exist yet, among those the server lets this client read. Registered again after a
    /// reconnection; unlike [`Client::observe`], changes made while disconnected are not
    /// reported.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut sensors = client.observe_pattern("sensors/*").await?;
    /// while let Some(change) = sensors.recv().await {
    ///     println!("{:?} {:?}", change.key, change.operation);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe_pattern(
        &self,
        pattern: impl Into<Bytes>,
    ) -> Result<crate::PatternObservation> {
        let pattern = non_empty(pattern.into(), "pattern")?;
        crate::pattern::observe(self, pattern, None).await
    }

    /// [`Client::observe_pattern`] that first receives every change after `since` of the keys
    /// the pattern matches, in order (`KEYNOTIFY pattern PATTERN SINCE version`). Fails with
    /// [`crate::ErrorKind::HistoryCompacted`] when the server no longer keeps them all.
    pub async fn observe_pattern_since(
        &self,
        pattern: impl Into<Bytes>,
        since: Hlc,
    ) -> Result<crate::PatternObservation> {
        let pattern = non_empty(pattern.into(), "pattern")?;
        crate::pattern::observe(self, pattern, Some(since)).await
    }

    /// `KEYNOTIFY ... STOP`: ends an observation (the same as
    /// [`Observation::unobserve`]).
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let door = client.observe("door").await?;
    /// client.unobserve(door).await?;
    /// # Ok(()) }
    /// ```
    pub async fn unobserve(&self, observation: Observation) -> Result<()> {
        observation.unobserve().await
    }

    /// `SCAN`: the keys matching a glob `pattern` (`*`, `?`, `[a-z]`,
    /// `[!x]`), fetched a page at a time as the pager is advanced.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// let mut pages = client.scan("sensor/*");
    /// while let Some(keys) = pages.next_page().await? {
    ///     for key in keys {
    ///         println!("{}", String::from_utf8_lossy(&key));
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn scan(&self, pattern: impl Into<Bytes>) -> KeyPager {
        KeyPager::new(self.clone(), pattern.into())
    }

    /// One SCAN request (used by [`KeyPager`]).
    pub(crate) async fn scan_page(
        &self,
        pattern: &Bytes,
        token: Option<&Bytes>,
    ) -> Result<(Vec<Bytes>, Option<Bytes>)> {
        let command = Command::Scan {
            pattern: non_empty(pattern.clone(), "pattern")?,
            token: token.cloned(),
        };
        match self.call(command, None).await?.response {
            Response::ScanPage { keys, token } => Ok((keys, token)),
            other => Err(Error::protocol(
                "SCAN",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    /// Closes the connection (sending DISCONNECT) for every clone of this
    /// client. Pending requests fail with [`Error::Closed`] and observation
    /// streams end.
    ///
    /// ```no_run
    /// # async fn demo(client: mqkv_client::Client) {
    /// client.disconnect().await;
    /// # }
    /// ```
    pub async fn disconnect(&self) {
        self.shared().shutdown();
        let mut link = self.shared().link();
        let _ = tokio::time::timeout(Duration::from_secs(2), link.wait_for(|s| s.closed)).await;
    }
}
