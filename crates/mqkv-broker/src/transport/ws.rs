//! MQTT over WebSocket (RFC 6455): the HTTP upgrade, and MQTT bytes in binary messages.
//!
//! The upgrade is answered here rather than by the WebSocket library, so that a request that
//! is not a WebSocket upgrade for the MQTT path gets an HTTP error that says what is wrong,
//! and the `mqtt` subprotocol (or the older `mqttv3.1`) is chosen. The library then frames
//! the connection: pings are answered, fragmented messages put together, and messages over
//! the size limit refused.

use std::net::SocketAddr;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

use super::origin::{self, Origins, Page};
use super::{Forwarded, Io};

/// Longest HTTP request head taken.
const MAX_HEAD: usize = 8 * 1024;
/// Most header lines taken.
const MAX_HEADERS: usize = 32;
/// Most bytes the WebSocket library reads at once.
const READ_BUFFER: usize = 8 * 1024;
/// The subprotocols MQTT clients ask for, in order of preference.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Why an upgrade was refused; the client was told with an HTTP error where it could be.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("connection closed during the upgrade")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("request head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed HTTP request")]
    Malformed,
    #[error("{status}: {reason}")]
    Refused { status: u16, reason: &'static str },
    #[error("a web page from {0}, an origin the listener does not list")]
    ForeignPage(String),
}

/// A request head that asks for the upgrade: the key to answer, the subprotocol chosen,
/// where a browser says the page comes from (`Origin`) and sent the request to (`Host`), and
/// what proxies say of the client (`Forwarded`, `X-Forwarded-For`: each header's value).
#[derive(Debug, PartialEq, Eq)]
pub struct Upgrade {
    pub key: String,
    pub protocol: Option<&'static str>,
    pub origin: Option<String>,
    pub host: Option<String>,
    pub forwarded: Vec<String>,
    pub x_forwarded_for: Vec<String>,
}

/// A WebSocket connection once upgraded.
pub(crate) struct Upgraded {
    pub ws: WebSocketStream<Io>,
    /// The origin of a web page the listener lets connect without trusting it (see
    /// [`Page::Foreign`]).
    pub foreign_page: Option<String>,
    /// The client behind the proxy, on a listener that takes forwarding headers.
    pub client: Option<SocketAddr>,
}

impl UpgradeError {
    /// The HTTP status the client is answered with, if it gets an answer.
    fn status(&self) -> Option<(u16, &'static str)> {
        match self {
            UpgradeError::Closed | UpgradeError::Io(_) => None,
            UpgradeError::TooLarge => Some((431, "request head too large")),
            UpgradeError::Malformed => Some((400, "malformed HTTP request")),
            UpgradeError::Refused { status, reason } => Some((*status, reason)),
            UpgradeError::ForeignPage(_) => Some((403, "this page's origin may not connect")),
        }
    }
}

/// What the request head received so far asks for: `Ok(None)` until the whole head has
/// arrived, then its length and the upgrade, or why it is refused.
pub fn parse_request(buf: &[u8], path: &str) -> Result<Option<(usize, Upgrade)>, UpgradeError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => Ok(Some((n, check(&req, path)?))),
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Ok(None),
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            Err(UpgradeError::TooLarge)
        }
        Err(_) => Err(UpgradeError::Malformed),
    }
}

fn refused(status: u16, reason: &'static str) -> UpgradeError {
    UpgradeError::Refused { status, reason }
}

/// Checks an HTTP request head (without the blank line's bytes mattering) for a WebSocket
/// upgrade of `path` that an MQTT client may use.
fn check(req: &httparse::Request<'_, '_>, path: &str) -> Result<Upgrade, UpgradeError> {
    if req.method != Some("GET") {
        return Err(refused(405, "only GET upgrades to WebSocket"));
    }
    let asked = req.path.unwrap_or("");
    let asked = asked.split('?').next().unwrap_or("");
    if asked != path {
        return Err(refused(404, "no MQTT WebSocket endpoint at this path"));
    }
    let header = |name: &'static str| {
        req.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
    };
    let has_token = |name: &'static str, token: &str| {
        header(name).any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    if !has_token("upgrade", "websocket") || !has_token("connection", "upgrade") {
        return Err(refused(
            426,
            "this endpoint speaks MQTT over WebSocket; upgrade the connection",
        ));
    }
    if !header("sec-websocket-version").any(|v| v.trim() == "13") {
        return Err(refused(426, "WebSocket version 13 is required"));
    }
    let key = header("sec-websocket-key")
        .next()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| refused(400, "Sec-WebSocket-Key is missing"))?;
    let offered: Vec<String> = header("sec-websocket-protocol")
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_ascii_lowercase())
        .collect();
    let protocol = if offered.is_empty() {
        // Some clients ask for none; the stream is MQTT all the same.
        None
    } else {
        let chosen = SUBPROTOCOLS
            .iter()
            .find(|p| offered.iter().any(|o| o == *p))
            .copied();
        Some(chosen.ok_or_else(|| refused(400, "the mqtt subprotocol is required"))?)
    };
    // A browser sends one of each; any Origin at all, readable or not, marks a web page.
    let raw = |name: &str| {
        let mut values = req
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_owned());
        match (values.next(), values.next()) {
            (_, Some(_)) => Err(refused(400, "more than one Origin or Host header")),
            (value, None) => Ok(value),
        }
    };
    let origin = raw("origin")?;
    let host = raw("host")?;
    let all = |name: &str| -> Vec<String> {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
            .collect()
    };
    Ok(Upgrade {
        key,
        protocol,
        origin,
        host,
        forwarded: all("forwarded"),
        x_forwarded_for: all("x-forwarded-for"),
    })
}

/// How a WebSocket listener takes upgrades: the path, the web pages it trusts, and the proxies
/// whose forwarding headers name the client.
pub(crate) struct Endpoint<'a> {
    pub path: &'a str,
    pub origins: &'a Origins,
    pub forwarded: Option<&'a Forwarded>,
    pub secure: bool,
}

/// Answers the WebSocket upgrade of an HTTP request for the endpoint's path on `io`, from
/// `peer`, or refuses it with an HTTP error: a web page of an origin the listener neither
/// lists nor serves where it lists some, and a request whose forwarding headers do not name a
/// client where the listener takes them.
pub(crate) async fn upgrade(
    mut io: Io,
    endpoint: &Endpoint<'_>,
    peer: SocketAddr,
    max_message: usize,
) -> Result<Upgraded, UpgradeError> {
    let Endpoint {
        path,
        origins,
        forwarded,
        secure,
    } = *endpoint;
    let mut buf = BytesMut::with_capacity(1024);
    let (head_len, upgrade) = loop {
        match parse_request(&buf, path) {
            Ok(Some(parsed)) => break parsed,
            Ok(None) => {}
            Err(e) => {
                if let Some((status, reason)) = e.status() {
                    respond_error(&mut io, status, reason).await;
                }
                return Err(e);
            }
        }
        if io.read_buf(&mut buf).await? == 0 {
            return Err(UpgradeError::Closed);
        }
    };
    let origin = upgrade.origin.as_deref();
    let judged = match origin::judge(origin, upgrade.host.as_deref(), secure, origins) {
        Page::None | Page::Trusted => Ok(None),
        Page::Foreign(origin) => Ok(Some(origin)),
        Page::Refused => Err(UpgradeError::ForeignPage(
            origin.unwrap_or_default().to_owned(),
        )),
    };
    let client = forwarded.map(|f| {
        f.client(peer, &upgrade.forwarded, &upgrade.x_forwarded_for)
            .map_err(|reason| refused(400, reason))
    });
    let (foreign_page, client) = match (judged, client.transpose()) {
        (Ok(foreign), Ok(client)) => (foreign, client),
        (Err(e), _) | (_, Err(e)) => {
            if let Some((status, reason)) = e.status() {
                respond_error(&mut io, status, reason).await;
            }
            return Err(e);
        }
    };
    let mut response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
        derive_accept_key(upgrade.key.as_bytes())
    );
    if let Some(p) = upgrade.protocol {
        response.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
    }
    response.push_str("\r\n");
    io.write_all(response.as_bytes()).await?;
    io.flush().await?;
    // Frames the client sent right behind its request are the stream's first bytes.
    let rest = buf.split_off(head_len).to_vec();
    let config = config(max_message);
    let ws = WebSocketStream::from_partially_read(io, rest, Role::Server, Some(config)).await;
    Ok(Upgraded {
        ws,
        foreign_page,
        client,
    })
}

/// How the library frames a connection whose MQTT packets may be `max_message` bytes long: no
/// message or frame longer than that is taken.
pub fn config(max_message: usize) -> WebSocketConfig {
    // The library zeroes its read buffer's room before each read: room for 8 KiB instead of
    // its default 128 KiB keeps that, and what an idle connection holds, small.
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message))
}

async fn respond_error(io: &mut Io, status: u16, reason: &str) {
    let title = match status {
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        426 => "Upgrade Required",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let body = format!("{reason}\n");
    let mut response = format!(
        "HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status == 426 {
        response.push_str("Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n");
    }
    response.push_str("\r\n");
    response.push_str(&body);
    let _ = io.write_all(response.as_bytes()).await;
    let _ = io.shutdown().await;
}

/// Takes what a received message carries: a binary message's bytes are appended to `buf`
/// (`Some(n)`, `None` for an empty one), a close is the end of the stream (`Some(0)`), control
/// messages are skipped (`None`; the library answers pings), and a text message breaks the
/// MQTT binding (an error).
pub fn take(m: Message, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
    match m {
        Message::Binary(b) if b.is_empty() => Ok(None),
        Message::Binary(b) => {
            buf.extend_from_slice(&b);
            Ok(Some(b.len()))
        }
        Message::Close(_) => Ok(Some(0)),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Ok(None),
        Message::Text(_) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "text WebSocket message: MQTT travels in binary messages",
        )),
    }
}

/// A WebSocket error as an I/O error.
pub(crate) fn io_error(e: tungstenite::Error) -> std::io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            std::io::ErrorKind::ConnectionAborted.into()
        }
        e => std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str, path: &str) -> Result<Upgrade, UpgradeError> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        assert!(matches!(
            req.parse(head.as_bytes()),
            Ok(httparse::Status::Complete(_))
        ));
        check(&req, path)
    }

    const GOOD: &str = "GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqttv3.1, mqtt\r\n\r\n";

    fn status(r: Result<Upgrade, UpgradeError>) -> u16 {
        match r {
            Err(UpgradeError::Refused { status, .. }) => status,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_mqtt_upgrade_gets_the_mqtt_subprotocol() {
        let u = parse(GOOD, "/mqtt").expect("accepted");
        assert_eq!(u.key, "dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(u.protocol, Some("mqtt"));
        let old = GOOD.replace("mqttv3.1, mqtt", "mqttv3.1");
        assert_eq!(parse(&old, "/mqtt").expect("ok").protocol, Some("mqttv3.1"));
        let none = GOOD.replace("Sec-WebSocket-Protocol: mqttv3.1, mqtt\r\n", "");
        assert_eq!(parse(&none, "/mqtt").expect("ok").protocol, None);
        let query = GOOD.replace("GET /mqtt ", "GET /mqtt?x=1 ");
        assert!(parse(&query, "/mqtt").is_ok());
    }

    #[test]
    fn forwarding_headers_are_kept_in_order_however_many() {
        let head = GOOD.replace(
            "Host: x\r\n",
            "Host: x\r\nX-Forwarded-For: 198.51.100.1, 10.0.0.3\r\nx-forwarded-for: 10.0.0.4\r\nForwarded: for=192.0.2.60\r\n",
        );
        let u = parse(&head, "/mqtt").expect("accepted");
        assert_eq!(u.x_forwarded_for, ["198.51.100.1, 10.0.0.3", "10.0.0.4"]);
        assert_eq!(u.forwarded, ["for=192.0.2.60"]);
        let u = parse(GOOD, "/mqtt").expect("accepted");
        assert!(u.x_forwarded_for.is_empty() && u.forwarded.is_empty());
    }

    #[test]
    fn the_page_origin_and_host_are_taken_once_each() {
        let page = GOOD.replace("Host: x\r\n", "Host: x\r\nOrigin: https://app.example\r\n");
        let u = parse(&page, "/mqtt").expect("accepted");
        assert_eq!(u.origin.as_deref(), Some("https://app.example"));
        assert_eq!(u.host.as_deref(), Some("x"));
        assert_eq!(parse(GOOD, "/mqtt").expect("accepted").origin, None);
        let twice = page.replace("Host: x\r\n", "Host: x\r\nOrigin: http://127.0.0.1\r\n");
        assert_eq!(status(parse(&twice, "/mqtt")), 400);
        let hosts = GOOD.replace("Host: x\r\n", "Host: x\r\nhost: y\r\n");
        assert_eq!(status(parse(&hosts, "/mqtt")), 400);
    }

    #[test]
    fn an_origin_that_is_not_text_still_marks_a_page() {
        let mut head = b"GET /mqtt HTTP/1.1\r\nHost: x\r\nOrigin: \xff\xfe\r\n".to_vec();
        head.extend_from_slice(&GOOD.as_bytes()["GET /mqtt HTTP/1.1\r\nHost: x\r\n".len()..]);
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        assert!(matches!(
            req.parse(&head),
            Ok(httparse::Status::Complete(_))
        ));
        let u = check(&req, "/mqtt").expect("accepted");
        assert!(u.origin.is_some_and(|o| !o.is_empty()));
    }

    #[test]
    fn requests_that_are_not_mqtt_upgrades_get_an_http_error() {
        assert_eq!(status(parse(GOOD, "/other")), 404);
        assert_eq!(status(parse(&GOOD.replace("GET", "POST"), "/mqtt")), 405);
        assert_eq!(
            status(parse("GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", "/mqtt")),
            426
        );
        assert_eq!(
            status(parse(&GOOD.replace("Version: 13", "Version: 8"), "/mqtt")),
            426
        );
        assert_eq!(
            status(parse(
                &GOOD.replace("mqttv3.1, mqtt", "chat, superchat"),
                "/mqtt"
            )),
            400
        );
        assert_eq!(
            status(parse(
                &GOOD.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
                "/mqtt"
            )),
            400
        );
    }
}
