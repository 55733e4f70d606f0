//! How to reach the broker and how patient to be.

use std::time::Duration;

use mqkv_protocol::Hlc;
use mqkv_protocol::SetCondition;
use rumqttc::v5::MqttOptions;
use rumqttc::Transport;

use crate::clock::random_uuid;
use crate::error::{Error, Result};

/// The shortest keep alive the MQTT library accepts.
const MIN_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Connection settings for [`Client::connect`](crate::Client::connect).
///
/// ```
/// use std::time::Duration;
/// use mqkv_client::ClientOptions;
///
/// let options = ClientOptions::new("127.0.0.1", 1883)
///     .client_id("sensor-7")
///     .credentials("app", "secret")
///     .request_timeout(Duration::from_secs(5));
/// assert_eq!(options.get_client_id(), "sensor-7");
/// ```
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) client_id: String,
    pub(crate) credentials: Option<(String, String)>,
    pub(crate) keep_alive: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) reconnect_min: Duration,
    pub(crate) reconnect_max: Duration,
    pub(crate) tls: Option<crate::TlsSettings>,
    pub(crate) websocket: Option<String>,
}

impl ClientOptions {
    /// Settings for the broker at `host:port`, with a random client id
    /// (`mqkv-<uuid>`), no credentials, a 30 s keep alive, a 10 s request
    /// timeout (the SDKs' default) and reconnection after 100 ms growing to
    /// 2 s between attempts.
    ///
    /// ```
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("broker.local", 1883);
    /// assert!(options.get_client_id().starts_with("mqkv-"));
    /// ```
    pub fn new(host: impl Into<String>, port: u16) -> ClientOptions {
        ClientOptions {
            host: host.into(),
            port,
            client_id: format!("mqkv-{}", random_uuid()),
            credentials: None,
            keep_alive: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(2),
            tls: None,
            websocket: None,
        }
    }

    /// Connects over TLS with these settings (see [`TlsSettings`](crate::TlsSettings)),
    /// to a TLS listener (port 8883 by convention).
    pub fn tls(mut self, tls: crate::TlsSettings) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Connects over WebSocket to the listener's `path` (`/mqtt` on mqkv's WebSocket
    /// listeners), asking for the `mqtt` subprotocol; with [`tls`](Self::tls) as well, over
    /// secure WebSocket (`wss`). The port is the WebSocket listener's.
    ///
    /// ```
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 8080).websocket("/mqtt");
    /// let mqtt = options.mqtt_options().unwrap();
    /// assert_eq!(mqtt.broker_address().0, "ws://127.0.0.1:8080/mqtt");
    /// ```
    pub fn websocket(mut self, path: impl Into<String>) -> Self {
        self.websocket = Some(path.into());
        self
    }

    /// The MQTT client id. It is also the observer identity for
    /// notifications and part of the response topic, so it must not contain
    /// `/`, `+` or `#`.
    ///
    /// ```
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883).client_id("pump-7");
    /// assert_eq!(options.get_client_id(), "pump-7");
    /// ```
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = client_id.into();
        self
    }

    /// The client id these options will connect with.
    ///
    /// ```
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883).client_id("pump-7");
    /// assert_eq!(options.get_client_id(), "pump-7");
    /// ```
    pub fn get_client_id(&self) -> &str {
        &self.client_id
    }

    /// User name and password for the CONNECT packet.
    ///
    /// ```
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883).credentials("app", "secret");
    /// ```
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some((username.into(), password.into()));
        self
    }

    /// MQTT keep alive interval; at least 5 s (shorter values are raised to 5 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883).keep_alive(Duration::from_secs(10));
    /// ```
    pub fn keep_alive(mut self, keep_alive: Duration) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    /// How long a request waits for its answer, across reconnections. The
    /// message expiry sent with each request is this, rounded up to whole
    /// seconds. Override per call site with
    /// [`Client::with_timeout`](crate::Client::with_timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883).request_timeout(Duration::from_secs(3));
    /// ```
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long the first connection attempt may take.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883).connect_timeout(Duration::from_secs(2));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Delay before the first reconnection attempt after a lost connection,
    /// doubling after each failed attempt up to `max`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mqkv_client::ClientOptions;
    ///
    /// let options = ClientOptions::new("127.0.0.1", 1883)
    ///     .reconnect_delay(Duration::from_millis(50), Duration::from_secs(5));
    /// ```
    pub fn reconnect_delay(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max.max(min);
        self
    }

    /// The MQTT library's settings for these options: the broker's address and transport
    /// (TCP, TLS, WebSocket or secure WebSocket), the client id, the credentials and the keep
    /// alive. For a program that also speaks plain MQTT (with `rumqttc`) to the same broker.
    ///
    /// ```
    /// use mqkv_client::ClientOptions;
    ///
    /// let mqtt = ClientOptions::new("::1", 8080).client_id("pump-7").websocket("/mqtt")
    ///     .mqtt_options()
    ///     .unwrap();
    /// assert_eq!(mqtt.broker_address().0, "ws://[::1]:8080/mqtt");
    /// assert_eq!(mqtt.client_id(), "pump-7");
    /// assert!(ClientOptions::new("127.0.0.1", 8080).websocket("mqtt").mqtt_options().is_err());
    /// ```
    pub fn mqtt_options(&self) -> Result<MqttOptions> {
        let mut mqtt = match &self.websocket {
            None => {
                let mut mqtt = MqttOptions::new(&self.client_id, &self.host, self.port);
                if let Some(tls) = &self.tls {
                    mqtt.set_transport(tls.transport());
                }
                mqtt
            }
            Some(path) => {
                if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(Error::InvalidArgument(format!(
                        "WebSocket path {path:?} must start with '/' and hold no spaces"
                    )));
                }
                let scheme = if self.tls.is_some() { "wss" } else { "ws" };
                let host = if self.host.contains(':') && !self.host.starts_with('[') {
                    format!("[{}]", self.host)
                } else {
                    self.host.clone()
                };
                let url = format!("{scheme}://{host}:{}{path}", self.port);
                let mut mqtt = MqttOptions::new(&self.client_id, url, self.port);
                mqtt.set_transport(match &self.tls {
                    Some(tls) => Transport::Wss(tls.configuration()),
                    None => Transport::Ws,
                });
                mqtt
            }
        };
        mqtt.set_keep_alive(self.keep_alive.max(MIN_KEEP_ALIVE));
        if let Some((user, password)) = &self.credentials {
            mqtt.set_credentials(user, password);
        }
        Ok(mqtt)
    }
}

/// Options of a SET.
///
/// ```
/// use std::time::Duration;
/// use mqkv_client::SetOptions;
///
/// // Create the key only if it does not exist, and let it expire after 5 s.
/// let options = SetOptions::new().nx().expires_in(Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetOptions {
    /// `NX` or `NEX`, or unconditional.
    pub condition: Option<SetCondition>,
    /// `PX`: the key expires this long after the SET. At least 1 ms.
    pub expires_in: Option<Duration>,
    /// `__ft`: the fencing token that proves the right to write a fenced key.
    pub fencing_token: Option<Hlc>,
}

impl SetOptions {
    /// Unconditional, no expiry, no fencing token.
    ///
    /// ```
    /// let options = mqkv_client::SetOptions::new();
    /// assert_eq!(options.condition, None);
    /// ```
    pub fn new() -> SetOptions {
        SetOptions::default()
    }

    /// Set only if the key does not exist.
    ///
    /// ```
    /// use mqkv_client::{SetCondition, SetOptions};
    ///
    /// assert_eq!(SetOptions::new().nx().condition, Some(SetCondition::Nx));
    /// ```
    pub fn nx(mut self) -> Self {
        self.condition = Some(SetCondition::Nx);
        self
    }

    /// Set only if the key does not exist or already holds this value
    /// (used to renew leases).
    ///
    /// ```
    /// use mqkv_client::{SetCondition, SetOptions};
    ///
    /// assert_eq!(SetOptions::new().nex().condition, Some(SetCondition::Nex));
    /// ```
    pub fn nex(mut self) -> Self {
        self.condition = Some(SetCondition::Nex);
        self
    }

    /// Set only if the key exists and its version is `version` (compare-and-set, an mqkv
    /// extension: see `docs/extensions.md`). Otherwise the SET is not applied and the
    /// outcome carries the key's current version, if it exists.
    ///
    /// ```
    /// use mqkv_client::{Hlc, SetCondition, SetOptions};
    ///
    /// let seen = Hlc::new(1_700_000_000_000, 0, "mqkv");
    /// let options = SetOptions::new().if_version(seen.clone());
    /// assert_eq!(options.condition, Some(SetCondition::IfVersion(seen)));
    /// ```
    pub fn if_version(mut self, version: Hlc) -> Self {
        self.condition = Some(SetCondition::IfVersion(version));
        self
    }

    /// Let the key expire `ttl` after this SET.
    ///
    /// ```
    /// use std::time::Duration;
    /// use mqkv_client::SetOptions;
    ///
    /// let options = SetOptions::new().expires_in(Duration::from_secs(30));
    /// ```
    pub fn expires_in(mut self, ttl: Duration) -> Self {
        self.expires_in = Some(ttl);
        self
    }

    /// Send `token` as the fencing token.
    ///
    /// ```
    /// # async fn demo(lease: mqkv_client::Lease) {
    /// if let Some(token) = lease.fencing_token() {
    ///     let options = mqkv_client::SetOptions::new().fencing_token(token);
    /// }
    /// # }
    /// ```
    pub fn fencing_token(mut self, token: Hlc) -> Self {
        self.fencing_token = Some(token);
        self
    }
}

/// Options of a DEL or VDEL.
///
/// ```
/// use mqkv_client::DelOptions;
/// use mqkv_protocol::Hlc;
///
/// let token: Hlc = "001700000000000:00000:mqkv".parse().unwrap();
/// let options = DelOptions::new().fencing_token(token);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelOptions {
    /// `__ft`: the fencing token that proves the right to delete a fenced key.
    pub fencing_token: Option<Hlc>,
    /// `IFVER` (DEL only; an mqkv extension): delete only if the key's version is this one.
    pub if_version: Option<Hlc>,
}

impl DelOptions {
    /// No fencing token.
    ///
    /// ```
    /// let options = mqkv_client::DelOptions::new();
    /// assert_eq!(options.fencing_token, None);
    /// ```
    pub fn new() -> DelOptions {
        DelOptions::default()
    }

    /// Send `token` as the fencing token.
    ///
    /// ```
    /// use mqkv_client::{DelOptions, Hlc};
    ///
    /// let token = Hlc::new(1_700_000_000_000, 0, "mqkv");
    /// assert_eq!(DelOptions::new().fencing_token(token.clone()).fencing_token, Some(token));
    /// ```
    pub fn fencing_token(mut self, token: Hlc) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// Delete only if the key's version is `version` (an mqkv extension; DEL only).
    ///
    /// ```
    /// use mqkv_client::{DelOptions, Hlc};
    ///
    /// let seen = Hlc::new(1_700_000_000_000, 0, "mqkv");
    /// assert_eq!(DelOptions::new().if_version(seen.clone()).if_version, Some(seen));
    /// ```
    pub fn if_version(mut self, version: Hlc) -> Self {
        self.if_version = Some(version);
        self
    }
}
