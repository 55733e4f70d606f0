//! A new connection's first steps: the transport's handshakes (TLS, the WebSocket upgrade),
//! the CONNECT, authentication, the cluster's claim on the client id, and the CONNACK.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::read_room::ReadRoom;
use super::writing::{self, WriteState, Writer, WriterTask};
use super::{negotiate, Conn, LiveGuard};
use crate::auth::AuthRequest;
use crate::codec::{self, reason, ConnAck, Connect, DecodeError, Packet, Properties};
use crate::inner::{identity, Inner};
use crate::placement::CachedWaker;
use crate::session::{Link, Message};
use crate::subtree::ClientId;
use crate::topic;
use crate::transport::{self, ProxyProtocol, ReadHalf, Transport, WriteHalf};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a client may take over the transport's handshakes (TLS, the WebSocket upgrade).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves a connection accepted on a listener of `transport`, from its handshakes to its end.
/// Behind a proxy (`proxy`), `peer` and `local` are the proxy's connection until its header
/// says where the client is.
pub(crate) async fn run(
    inner: Arc<Inner>,
    mut tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    transport: Arc<Transport>,
    proxy: Option<Arc<ProxyProtocol>>,
) {
    // The handshakes have one deadline: the proxy's header, TLS, the WebSocket upgrade.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    // Behind a proxy, the client's address is known once the proxy has said it.
    let behind_proxy = proxy.is_some() || transport.forwarded().is_some();
    let direct = (!behind_proxy).then_some(peer.ip());
    let (mut live, mut over_limit) = LiveGuard::new(inner.clone(), direct, transport.kind());
    let (peer, local) = match &proxy {
        None => (peer, local),
        Some(proxy) => {
            match tokio::time::timeout_at(deadline, proxy.read(&mut tcp, peer, local)).await {
                Ok(Ok(addresses)) => addresses,
                Ok(Err(e)) => {
                    tracing::info!(%peer, kind = transport.kind(), error = %e, "connection refused: PROXY protocol");
                    handshake_failed(&inner, "proxy");
                    return;
                }
                Err(_) => {
                    tracing::info!(%peer, kind = transport.kind(), "PROXY protocol header not received in time");
                    handshake_failed(&inner, "timeout");
                    return;
                }
            }
        }
    };
    if proxy.is_some() {
        over_limit = live.count(peer.ip());
    }
    tracing::debug!(%peer, kind = transport.kind(), "connection accepted");
    let max_in = inner.config.max_packet_size as usize;
    // A WebSocket message may carry a whole packet and the start of the next.
    let max_message = max_in.saturating_add(MAX_MESSAGE_SLACK);
    let accepted = tokio::time::timeout_at(
        deadline,
        transport::accept(tcp, peer, &transport, max_message),
    )
    .await;
    let transport::Accepted {
        stream,
        certificate,
        foreign_page,
        forwarded_client,
    } = match accepted {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(e)) => {
            tracing::info!(%peer, kind = transport.kind(), error = %e, "connection refused");
            handshake_failed(
                &inner,
                match e {
                    transport::AcceptError::Tls(_) => "tls",
                    transport::AcceptError::WebSocket(_) => "websocket",
                },
            );
            return;
        }
        Err(_) => {
            tracing::info!(%peer, kind = transport.kind(), "handshake not finished in time");
            handshake_failed(&inner, "timeout");
            return;
        }
    };
    // Behind an HTTP proxy the client is where its forwarding headers say. The address it
    // connected to is not known: it counts as local only from a loopback address itself.
    let (peer, local) = match forwarded_client {
        None => (peer, local),
        Some(client) => {
            tracing::debug!(proxy = %peer, %client, "client behind a WebSocket proxy");
            over_limit = live.count(client.ip());
            let local = match client.ip().is_loopback() {
                true => local,
                false => SocketAddr::new(unspecified(local.ip()), local.port()),
            };
            (client, local)
        }
    };
    let (mut rd, mut wr) = stream.split();
    let mut read_room = ReadRoom::new();
    let mut buf = BytesMut::with_capacity(ReadRoom::MIN);

    let connect = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        read_connect(&mut rd, &mut buf, &mut read_room, max_in),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(ConnectFailure::Decode(DecodeError::UnsupportedProtocol(level)))) => {
            tracing::debug!(%peer, level, "unsupported protocol version");
            let ack = Packet::ConnAck(ConnAck {
                reason_code: reason::UNSUPPORTED_PROTOCOL_VERSION,
                ..Default::default()
            });
            let mut out = BytesMut::new();
            ack.encode(
                &mut out,
                if level == codec::V5 {
                    codec::V5
                } else {
                    codec::V311
                },
            );
            send_and_close(&mut wr, out).await;
            return;
        }
        Ok(Err(ConnectFailure::Decode(e))) if peek_level(&buf) == Some(codec::V5) => {
            // An MQTT 5 CONNECT that breaks the rules: say why before closing.
            tracing::debug!(%peer, error = %e, "invalid CONNECT");
            let mut out = BytesMut::new();
            Packet::ConnAck(ConnAck {
                reason_code: e.reason_code(),
                ..Default::default()
            })
            .encode(&mut out, codec::V5);
            send_and_close(&mut wr, out).await;
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = ?e, "connection closed before CONNECT completed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "no CONNECT in time");
            return;
        }
    };
    let level = connect.protocol_level;
    let v5 = level == codec::V5;

    let refuse = |code: u8| async move {
        let mut out = BytesMut::new();
        Packet::ConnAck(ConnAck {
            reason_code: code,
            ..Default::default()
        })
        .encode(&mut out, level);
        out
    };

    if over_limit {
        tracing::info!(%peer, "connection refused: too many connections from this address");
        let out = refuse(reason::QUOTA_EXCEEDED).await;
        send_and_close(&mut wr, out).await;
        return;
    }

    // Client identifier.
    let mut assigned = None;
    let client_id: ClientId = if connect.client_id.is_empty() {
        if !v5 && !connect.clean_start {
            let out = refuse(reason::CLIENT_IDENTIFIER_NOT_VALID).await;
            send_and_close(&mut wr, out).await;
            return;
        }
        let id = format!("mqkv-{:016x}", rand::random::<u64>());
        assigned = Some(id.clone());
        id.into()
    } else {
        connect.client_id.as_str().into()
    };

    // Will.
    let will = match &connect.will {
        None => None,
        Some(w) => {
            if !topic::valid_topic_name(&w.topic) {
                let out = refuse(reason::TOPIC_NAME_INVALID).await;
                send_and_close(&mut wr, out).await;
                return;
            }
            if w.properties.payload_format_indicator == Some(1)
                && std::str::from_utf8(&w.payload).is_err()
            {
                let out = refuse(reason::PAYLOAD_FORMAT_INVALID).await;
                send_and_close(&mut wr, out).await;
                return;
            }
            let mut props = w.properties.clone();
            let delay = props.will_delay_interval.take().unwrap_or(0);
            Some((
                Arc::new(Message {
                    topic: w.topic.clone(),
                    payload: w.payload.clone(),
                    qos: w.qos,
                    retain: w.retain,
                    expires_at: props
                        .message_expiry_interval
                        .map(|s| Instant::now() + Duration::from_secs(u64::from(s))),
                    properties: props,
                    publisher: Some(client_id.clone()),
                }),
                delay,
            ))
        }
    };

    // Authentication: a password check off the connection threads, as it is slow on purpose.
    let request = AuthRequest {
        client_id: &client_id,
        username: connect.username.as_deref(),
        password: connect.password.as_ref(),
        certificate: certificate.as_ref(),
        foreign_page: foreign_page.as_deref(),
        authentication_method: connect.properties.authentication_method(),
        authentication_data: connect
            .properties
            .rare
            .as_ref()
            .and_then(|r| r.authentication_data.as_ref()),
        peer,
        local,
    };
    let authenticated = if inner.auth.is_slow(&request) {
        let auth = inner.auth.clone();
        let (client_id, username, password) = (
            client_id.to_string(),
            connect.username.clone(),
            connect.password.clone(),
        );
        let method = request.authentication_method.map(str::to_owned);
        let data = request.authentication_data.cloned();
        let certificate = certificate.clone();
        let foreign_page = foreign_page.clone();
        tokio::task::spawn_blocking(move || {
            auth.authenticate(&AuthRequest {
                client_id: &client_id,
                username: username.as_deref(),
                password: password.as_ref(),
                certificate: certificate.as_ref(),
                foreign_page: foreign_page.as_deref(),
                authentication_method: method.as_deref(),
                authentication_data: data.as_ref(),
                peer,
                local,
            })
        })
        .await
        .unwrap_or(Err(reason::UNSPECIFIED_ERROR))
    } else {
        inner.auth.authenticate(&request)
    };
    let principal = match authenticated {
        Ok(p) => {
            inner.throttle.succeeded(peer.ip());
            crate::stats::add(&inner.stats.here().authentication_successes, 1);
            Arc::new(p)
        }
        Err(code) => {
            crate::stats::add(&inner.stats.here().authentication_failures, 1);
            let wait = match code {
                reason::BAD_USER_NAME_OR_PASSWORD | reason::NOT_AUTHORIZED => {
                    inner.throttle.failed(peer.ip(), Instant::now())
                }
                _ => Duration::ZERO,
            };
            tracing::info!(%peer, client_id = %client_id, code, delay_ms = wait.as_millis() as u64, "connection refused");
            tokio::time::sleep(wait).await;
            let out = refuse(code).await;
            send_and_close(&mut wr, out).await;
            return;
        }
    };

    // Authorization: the connection itself, then the will's topic.
    let policy_generation = inner.policy.generation();
    let grants = inner.policy.grants(&client_id, &principal);
    if let Some(grants) = &grants {
        let refused = if !grants.may_connect() {
            Some("connection not allowed by the policy")
        } else if will
            .as_ref()
            .is_some_and(|(w, _)| !grants.may_publish(&w.topic))
        {
            Some("will topic not allowed by the policy")
        } else {
            None
        };
        if let Some(why) = refused {
            tracing::info!(%peer, client_id = %client_id, username = ?principal.username, "connection refused: {why}");
            let out = refuse(reason::NOT_AUTHORIZED).await;
            send_and_close(&mut wr, out).await;
            return;
        }
    }

    // Room for one more session, unless the client has one.
    let full = {
        let sessions = inner.sessions.lock();
        sessions.len() >= inner.config.max_sessions && !sessions.contains_key(&client_id)
    };
    if full {
        tracing::info!(%peer, client_id = %client_id, "connection refused: too many sessions");
        let out = refuse(reason::QUOTA_EXCEEDED).await;
        send_and_close(&mut wr, out).await;
        return;
    }

    let cfg = &inner.config;
    let granted = negotiate::negotiate(&connect, cfg);
    let keep_alive = granted.keep_alive;
    let expiry = granted.expiry;

    let conn_id = inner.next_connection_id();
    let category = inner.categories.number(
        connect
            .properties
            .user_properties
            .iter()
            .find(|(k, _)| k == crate::stats::CATEGORY_PROPERTY)
            .map(|(_, v)| &**v),
    );
    let mut link = Link::new(
        conn_id,
        level,
        granted.client_receive_max,
        granted.client_max_packet,
        granted.client_alias_max,
    );
    link.category = category;
    let notify = link.notify.clone();
    let handover = link.handover.clone();
    let relocate = link.relocate.clone();
    if let Some(federation) = inner.federation.get() {
        let claim = crate::replicated::Claim {
            client_id: client_id.to_string(),
            conn_id,
            clean_start: connect.clean_start,
            expiry_interval: expiry,
            will: will
                .as_ref()
                .map(|(m, delay)| crate::replicated::WillRecord {
                    message: crate::persist::StoredMessage::of(m),
                    delay: *delay,
                }),
        };
        match federation.claim(claim).await {
            Ok(Some(record)) if !connect.clean_start => inner.restore(&client_id, record),
            Ok(_) => {}
            Err(code) => {
                tracing::info!(%peer, client_id = %client_id, code, "connection refused by the cluster");
                let out = refuse(code).await;
                send_and_close(&mut wr, out).await;
                return;
            }
        }
    }
    inner.hand_over(&client_id).await;
    let attached = inner.attach(&client_id, connect.clean_start, expiry, link);
    inner.authorize_session(&attached.session, &principal, grants.clone());
    let session = attached.session;

    let mut props = match v5 {
        true => negotiate::connack_properties(&granted, &connect, cfg, assigned, &client_id),
        false => Properties::default(),
    };
    let auth_method = connect
        .properties
        .authentication_method()
        .map(str::to_owned);
    if let Some(method) = &auth_method {
        props.rare_mut().authentication_method = Some(method.clone());
    }
    session.send_control(
        conn_id,
        Packet::ConnAck(ConnAck {
            session_present: attached.session_present,
            reason_code: reason::SUCCESS,
            properties: props,
        }),
    );
    tracing::debug!(%peer, client_id = %client_id, level, "client connected");

    let principal_expiry = principal.expires_at;
    let ident = identity(&client_id, principal, grants, peer, conn_id);
    for service in inner.services() {
        service.on_connect(&ident);
    }

    let wr: Writer = Arc::new(tokio::sync::Mutex::new(WriteState {
        half: Some(wr),
        pending: BytesMut::new(),
    }));
    writing::attach(
        &session,
        conn_id,
        &wr,
        &notify,
        transport::cheap_writes(&rd),
    );
    let writer = WriterTask::spawn(session.clone(), conn_id, notify.clone(), wr.clone(), level);
    let conn = Conn {
        inner: inner.clone(),
        session: session.clone(),
        conn_id,
        level,
        category,
        client_id: client_id.clone(),
        ident: ident.clone(),
        policy_generation,
        auth_method,
        credential_expires: super::reauth::expiry_instant(principal_expiry),
        expiry_changed: false,
        local,
        aliases: Vec::new(),
        session_expiry: expiry,
        will,
        wr,
        notify,
        services: inner.service_claims(),
        waker: CachedWaker::default(),
        handover,
        relocate,
        moves: 0,
        move_after: Instant::now(),
        published: false,
        has_published: false,
        read_room,
        queued: VecDeque::new(),
        front_fresh: false,
    };
    conn.serve(rd, buf, keep_alive, writer, live).await;
}

#[derive(Debug)]
pub(super) enum ConnectFailure {
    Io,
    Decode(DecodeError),
    NotConnect,
}

/// The protocol level of a CONNECT at the front of `buf`, if that much has arrived.
pub(super) fn peek_level(buf: &[u8]) -> Option<u8> {
    let header_len = 1 + buf.iter().skip(1).take(4).position(|b| b & 0x80 == 0)? + 1;
    let rest = buf.get(header_len..)?;
    if rest.get(..6)? == b"\x00\x04MQTT" {
        rest.get(6).copied()
    } else {
        None
    }
}

pub(super) async fn read_connect(
    rd: &mut ReadHalf,
    buf: &mut BytesMut,
    read_room: &mut ReadRoom,
    max: usize,
) -> Result<Connect, ConnectFailure> {
    loop {
        if buf.first().is_some_and(|b| b >> 4 != 1) {
            // Not a CONNECT: no need to wait for the rest of it.
            return Err(ConnectFailure::NotConnect);
        }
        // Decode from a view so that a rejected CONNECT stays in `buf` for `peek_level`.
        let mut view = buf.clone();
        let decoded = codec::decode(&mut view, None, max);
        if decoded.is_ok() {
            *buf = view;
        }
        match decoded {
            Ok(Some(Packet::Connect(c))) => return Ok(*c),
            Ok(Some(_)) => return Err(ConnectFailure::NotConnect),
            Ok(None) => {}
            Err(e) => return Err(ConnectFailure::Decode(e)),
        }
        let room = read_room.make(buf);
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(ConnectFailure::Io),
            Ok(n) => read_room.read(n, room),
        }
    }
}

/// How much larger than the largest packet a WebSocket message may be.
const MAX_MESSAGE_SLACK: usize = 64 * 1024;

/// Sends `out` (a refusing CONNACK) and closes the sending side.
pub(super) async fn send_and_close(wr: &mut WriteHalf, mut out: BytesMut) {
    if wr.write_all(&mut out).await.is_ok() {
        wr.shutdown().await;
    }
}

/// The unspecified address of `ip`'s family.
fn unspecified(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// Counts a connection that ended before MQTT began, by `reason` (one of
/// [`crate::stats::HANDSHAKE_FAILURES`]).
fn handshake_failed(inner: &Inner, reason: &str) {
    let reasons = crate::stats::HANDSHAKE_FAILURES;
    if let Some(i) = reasons.iter().position(|r| *r == reason) {
        crate::stats::add(&inner.stats.here().handshake_failures[i], 1);
    }
}
