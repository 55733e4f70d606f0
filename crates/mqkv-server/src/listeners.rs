//! Listeners of every kind: the `[[listeners]]` tables and `[tls]` defaults of the
//! configuration, turned into the broker's transports, and the addresses they are bound to.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use mqkv_broker::transport::forwarded::ForwardingHeader;
use mqkv_broker::transport::{Forwarded, Origins, ProxyProtocol, TlsVersion};
use mqkv_broker::{Tls, TlsFiles, Transport};
use serde::{Deserialize, Serialize};

/// How clients reach a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// MQTT over TCP.
    Tcp,
    /// MQTT over TLS.
    Tls,
    /// MQTT over WebSocket.
    Ws,
    /// MQTT over WebSocket over TLS.
    Wss,
}

impl ListenerKind {
    fn secure(self) -> bool {
        matches!(self, ListenerKind::Tls | ListenerKind::Wss)
    }

    fn websocket(self) -> bool {
        matches!(self, ListenerKind::Ws | ListenerKind::Wss)
    }

    pub fn name(self) -> &'static str {
        match self {
            ListenerKind::Tcp => "tcp",
            ListenerKind::Tls => "tls",
            ListenerKind::Ws => "ws",
            ListenerKind::Wss => "wss",
        }
    }
}

/// The WebSocket path when a listener names none.
pub const DEFAULT_WS_PATH: &str = "/mqtt";

/// One `[[listeners]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub kind: ListenerKind,
    pub address: SocketAddr,
    /// TLS certificate chain (PEM); the `[tls]` one when not given.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// TLS private key (PEM); the `[tls]` one when not given.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// CA bundle (PEM) client certificates are verified against; the `[tls]` one when not
    /// given.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// Refuse TLS clients without a verified certificate; the `[tls]` setting when not given.
    #[serde(default)]
    pub require_client_cert: Option<bool>,
    /// Certificate revocation lists (PEM) for client certificates; the `[tls]` one when not
    /// given.
    #[serde(default)]
    pub crl: Option<PathBuf>,
    /// The oldest TLS version clients may use (`"1.2"` or `"1.3"`); the `[tls]` one when not
    /// given.
    #[serde(default)]
    pub min_version: Option<TlsVersion>,
    /// WebSocket path (default `/mqtt`).
    #[serde(default)]
    pub path: Option<String>,
    /// Web page origins (`https://app.example`, or `*`) a WebSocket listener trusts besides
    /// its own; when given, pages of other origins are refused.
    #[serde(default)]
    pub allowed_origins: Option<Vec<String>>,
    /// Every connection starts with a PROXY protocol header (version 1 or 2) from the load
    /// balancer or reverse proxy in front, which names the client's address.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// A `ws` or `wss` listener behind an HTTP reverse proxy: the header the proxy adds the
    /// client's address to, `X-Forwarded-For` or `Forwarded`, which then names the client.
    #[serde(default)]
    pub forwarded_header: Option<String>,
    /// The proxies (addresses or networks, `10.0.0.0/8`) that may connect to a
    /// `proxy_protocol` or `forwarded_header` listener; any when not given.
    #[serde(default)]
    pub proxy_from: Option<Vec<String>>,
}

/// The `[tls]` table: TLS settings for listeners that give none of their own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsDefaults {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    pub require_client_cert: bool,
    pub crl: Option<PathBuf>,
    pub min_version: TlsVersion,
}

/// Why listener settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("{kind} listener {address}: {reason}")]
    Invalid {
        kind: &'static str,
        address: SocketAddr,
        reason: String,
    },
    // Not a `source`: the message already says it, and a chain printer would say it twice.
    #[error("{kind} listener {address}: {reason}")]
    Tls {
        kind: &'static str,
        address: SocketAddr,
        reason: mqkv_broker::transport::TlsError,
    },
}

/// A listener bound to its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub kind: ListenerKind,
    pub addr: SocketAddr,
    /// The WebSocket path.
    pub path: Option<String>,
}

impl std::fmt::Display for Endpoint {
    /// Plain TCP as the bare address; the others as a URL (`tls://127.0.0.1:8883`,
    /// `ws://127.0.0.1:8080/mqtt`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ListenerKind::Tcp => write!(f, "{}", self.addr),
            kind => write!(
                f,
                "{}://{}{}",
                kind.name(),
                self.addr,
                self.path.as_deref().unwrap_or("")
            ),
        }
    }
}

/// A listener ready to bind: its address, transport, and the TLS settings it reloads.
pub(crate) struct Planned {
    pub kind: ListenerKind,
    pub address: SocketAddr,
    pub transport: Transport,
    pub path: Option<String>,
    /// The PROXY protocol settings of a listener behind a proxy.
    pub proxy: Option<ProxyProtocol>,
}

/// Turns the plain `listen` addresses and the `[[listeners]]` tables into transports. TLS
/// files are read here, once for listeners that share them; the TLS settings are returned
/// too, to reload on request.
pub(crate) fn plan(
    listen: &[SocketAddr],
    listeners: &[ListenerConfig],
    defaults: &TlsDefaults,
) -> Result<(Vec<Planned>, Vec<Arc<Tls>>), ListenerError> {
    let mut planned: Vec<Planned> = listen
        .iter()
        .map(|&address| Planned {
            kind: ListenerKind::Tcp,
            address,
            transport: Transport::Tcp,
            path: None,
            proxy: None,
        })
        .collect();
    let mut loaded: Vec<Arc<Tls>> = Vec::new();
    for l in listeners {
        let invalid = |reason: &str| ListenerError::Invalid {
            kind: l.kind.name(),
            address: l.address,
            reason: reason.to_owned(),
        };
        let tls_given = l.cert.is_some()
            || l.key.is_some()
            || l.client_ca.is_some()
            || l.require_client_cert.is_some()
            || l.crl.is_some()
            || l.min_version.is_some();
        if !l.kind.secure() && tls_given {
            return Err(invalid(
                "certificates are for tls and wss listeners; use kind = \"tls\" or \"wss\"",
            ));
        }
        if !l.kind.websocket() && l.path.is_some() {
            return Err(invalid("a path is for ws and wss listeners"));
        }
        if !l.kind.websocket() && l.allowed_origins.is_some() {
            return Err(invalid("allowed_origins is for ws and wss listeners"));
        }
        if l.allowed_origins.as_ref().is_some_and(Vec::is_empty) {
            return Err(invalid(
                "allowed_origins is empty: leave it out, or list the origins to trust",
            ));
        }
        for entry in l.allowed_origins.iter().flatten() {
            mqkv_broker::transport::origin::check(entry).map_err(|e| invalid(&e))?;
        }
        let origins = Origins::new(l.allowed_origins.iter().flatten());
        let header = match &l.forwarded_header {
            None => None,
            Some(_) if !l.kind.websocket() => {
                return Err(invalid("forwarded_header is for ws and wss listeners"))
            }
            Some(_) if l.proxy_protocol => {
                return Err(invalid("give proxy_protocol or forwarded_header, not both"))
            }
            Some(name) => Some(name.parse::<ForwardingHeader>().map_err(|e| invalid(&e))?),
        };
        let behind_proxy = l.proxy_protocol || header.is_some();
        let from = match &l.proxy_from {
            None => Vec::new(),
            Some(_) if !behind_proxy => {
                return Err(invalid(
                    "proxy_from is for listeners with proxy_protocol or forwarded_header",
                ))
            }
            Some(from) if from.is_empty() => {
                return Err(invalid(
                    "proxy_from is empty: leave it out, or list the proxies",
                ))
            }
            Some(from) => from.clone(),
        };
        let proxy_from = |e: String| invalid(&format!("proxy_from: {e}"));
        let proxy = match l.proxy_protocol {
            true => Some(ProxyProtocol::new(&from).map_err(proxy_from)?),
            false => None,
        };
        let forwarded = match header {
            Some(header) => Some(Forwarded::new(header, &from).map_err(proxy_from)?),
            None => None,
        };
        let path = match l.kind.websocket() {
            true => {
                let path = l.path.clone().unwrap_or_else(|| DEFAULT_WS_PATH.into());
                if !path.starts_with('/') || path.contains(char::is_whitespace) {
                    return Err(invalid(
                        "the WebSocket path must start with / and hold no spaces",
                    ));
                }
                Some(path)
            }
            false => None,
        };
        let tls = match l.kind.secure() {
            false => None,
            true => {
                let (Some(cert), Some(key)) = (
                    l.cert.clone().or_else(|| defaults.cert.clone()),
                    l.key.clone().or_else(|| defaults.key.clone()),
                ) else {
                    return Err(invalid(
                        "needs a certificate and key (cert and key, [tls], or --tls-cert and --tls-key)",
                    ));
                };
                let files = TlsFiles {
                    cert,
                    key,
                    client_ca: l.client_ca.clone().or_else(|| defaults.client_ca.clone()),
                    require_client_cert: l
                        .require_client_cert
                        .unwrap_or(defaults.require_client_cert),
                    crl: l.crl.clone().or_else(|| defaults.crl.clone()),
                    min_version: l.min_version.unwrap_or(defaults.min_version),
                };
                let tls = match loaded.iter().find(|t| *t.files() == files) {
                    Some(t) => t.clone(),
                    None => {
                        let t = Tls::load(files).map_err(|reason| ListenerError::Tls {
                            kind: l.kind.name(),
                            address: l.address,
                            reason,
                        })?;
                        let t = Arc::new(t);
                        loaded.push(t.clone());
                        t
                    }
                };
                Some(tls)
            }
        };
        let transport = match (l.kind, tls, path.clone()) {
            (ListenerKind::Tcp, _, _) => Transport::Tcp,
            (ListenerKind::Tls, Some(tls), _) => Transport::Tls(tls),
            (ListenerKind::Ws, _, Some(path)) => Transport::Ws {
                path,
                origins,
                forwarded,
            },
            (ListenerKind::Wss, Some(tls), Some(path)) => Transport::Wss {
                tls,
                path,
                origins,
                forwarded,
            },
            _ => return Err(invalid("incomplete settings")),
        };
        planned.push(Planned {
            kind: l.kind,
            address: l.address,
            transport,
            path,
            proxy,
        });
    }
    Ok((planned, loaded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(kind: ListenerKind) -> ListenerConfig {
        ListenerConfig {
            kind,
            address: "127.0.0.1:0".parse().expect("addr"),
            cert: None,
            key: None,
            client_ca: None,
            require_client_cert: None,
            crl: None,
            min_version: None,
            path: None,
            allowed_origins: None,
            proxy_protocol: false,
            forwarded_header: None,
            proxy_from: None,
        }
    }

    #[test]
    fn tables_parse_and_websocket_listeners_get_the_default_path() {
        let c: crate::ServerConfig = toml::from_str(
            r#"
            [[listeners]]
            kind = "ws"
            address = "127.0.0.1:8080"

            [[listeners]]
            kind = "wss"
            address = "0.0.0.0:8443"
            cert = "a.pem"
            key = "a.key"
            path = "/ws"
            require_client_cert = true
            client_ca = "ca.pem"
            crl = "crl.pem"
            min_version = "1.3"
            "#,
        )
        .expect("parses");
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(c.listeners[1].path.as_deref(), Some("/ws"));
        assert_eq!(
            c.listeners[1].crl.as_deref(),
            Some(std::path::Path::new("crl.pem"))
        );
        let (planned, _) = plan(&[], &c.listeners[..1], &TlsDefaults::default()).expect("plan");
        assert_eq!(planned[0].path.as_deref(), Some(DEFAULT_WS_PATH));
        let bad: Result<crate::ServerConfig, _> =
            toml::from_str("[[listeners]]\nkind = \"quic\"\naddress = \"127.0.0.1:1\"\n");
        assert!(bad.is_err());
    }

    #[test]
    fn settings_that_do_not_fit_their_kind_are_refused() {
        let none = TlsDefaults::default();
        let err = |l: ListenerConfig| match plan(&[], &[l], &none) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        assert!(err(listener(ListenerKind::Tls)).contains("needs a certificate and key"));
        assert!(err(listener(ListenerKind::Wss)).contains("needs a certificate and key"));
        let mut tcp = listener(ListenerKind::Tcp);
        tcp.cert = Some("a.pem".into());
        assert!(err(tcp).contains("certificates are for tls and wss"));
        let mut tcp = listener(ListenerKind::Tcp);
        tcp.path = Some("/mqtt".into());
        assert!(err(tcp).contains("a path is for ws"));
        let mut ws = listener(ListenerKind::Ws);
        ws.path = Some("mqtt".into());
        assert!(err(ws).contains("must start with /"));
        let mut tls = listener(ListenerKind::Tls);
        tls.cert = Some("/nonexistent/cert.pem".into());
        tls.key = Some("/nonexistent/key.pem".into());
        assert!(err(tls).contains("cannot read /nonexistent/cert.pem"));
        let mut tcp = listener(ListenerKind::Tcp);
        tcp.allowed_origins = Some(vec!["https://a.example".into()]);
        assert!(err(tcp).contains("allowed_origins is for ws and wss"));
        let mut ws = listener(ListenerKind::Ws);
        ws.allowed_origins = Some(vec![]);
        assert!(err(ws).contains("allowed_origins is empty"));
        let mut ws = listener(ListenerKind::Ws);
        ws.allowed_origins = Some(vec!["a.example".into()]);
        assert!(err(ws).contains("allowed origin \"a.example\""));
        let mut tcp = listener(ListenerKind::Tcp);
        tcp.proxy_from = Some(vec!["10.0.0.0/8".into()]);
        assert!(err(tcp).contains("proxy_from is for listeners with proxy_protocol"));
        let mut tcp = listener(ListenerKind::Tcp);
        tcp.forwarded_header = Some("X-Forwarded-For".into());
        assert!(err(tcp).contains("forwarded_header is for ws and wss"));
        let mut ws = listener(ListenerKind::Ws);
        ws.forwarded_header = Some("X-Forwarded-For".into());
        ws.proxy_protocol = true;
        assert!(err(ws).contains("not both"));
        let mut ws = listener(ListenerKind::Ws);
        ws.forwarded_header = Some("X-Real-IP".into());
        assert!(err(ws).contains("give \"X-Forwarded-For\" or \"Forwarded\""));
        let mut tcp = listener(ListenerKind::Tcp);
        tcp.proxy_protocol = true;
        tcp.proxy_from = Some(vec![]);
        assert!(err(tcp.clone()).contains("proxy_from is empty"));
        tcp.proxy_from = Some(vec!["lb.internal".into()]);
        assert!(err(tcp).contains("proxy_from: \"lb.internal\" is not an address"));
    }

    #[test]
    fn proxy_protocol_listeners_from_the_file() {
        let c: crate::ServerConfig = toml::from_str(
            r#"
            [[listeners]]
            kind = "tcp"
            address = "0.0.0.0:1884"
            proxy_protocol = true
            proxy_from = ["10.0.0.0/8", "192.0.2.5"]

            [[listeners]]
            kind = "ws"
            address = "127.0.0.1:8080"
            proxy_protocol = true
            "#,
        )
        .expect("parses");
        let (planned, _) = plan(&[], &c.listeners, &c.tls).expect("plans");
        let from = |i: usize| planned[i].proxy.as_ref().map(|p| p.from.len());
        assert_eq!(from(0), Some(2));
        assert_eq!(from(1), Some(0), "any proxy");
        let plain = plan(&["127.0.0.1:1883".parse().expect("addr")], &[], &c.tls).expect("plans");
        assert!(plain.0[0].proxy.is_none());
    }

    #[test]
    fn endpoints_print_as_an_address_or_a_url() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        let e = |kind, path: Option<&str>| Endpoint {
            kind,
            addr,
            path: path.map(str::to_owned),
        };
        assert_eq!(e(ListenerKind::Tcp, None).to_string(), "127.0.0.1:8080");
        assert_eq!(
            e(ListenerKind::Tls, None).to_string(),
            "tls://127.0.0.1:8080"
        );
        assert_eq!(
            e(ListenerKind::Ws, Some("/mqtt")).to_string(),
            "ws://127.0.0.1:8080/mqtt"
        );
    }
}
