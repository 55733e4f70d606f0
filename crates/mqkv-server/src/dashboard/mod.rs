//! The web dashboard at `/`: the store's keys, a live feed of the changes to keys the viewer
//! picks, the connected clients, the cluster and throughput charts. Its page, script and
//! styles are built into the binary; the page reads the JSON API below.
//!
//! ```text
//! GET  /api/me                      who the viewer is, and whether a login is needed
//! POST /api/login  {username, password}   sets the session cookie
//! POST /api/logout
//! GET  /api/overview                counts and quotas
//! GET  /api/keys?pattern=&after=&limit=   a page of records (after: the hex of a key)
//! POST /api/keys/set  {key, value, px_ms}  SET, as the viewer (logged in only)
//! POST /api/keys/delete {key}            DEL, as the viewer (logged in only)
//! GET  /api/feed?keys=["a","b"]     server-sent events: each change of those keys
//! GET  /api/clients                 sessions, their subscriptions and in-flight counts
//! GET  /api/cluster                 the nodes and their roles
//! GET  /api/series                  the throughput of the last minutes
//! ```
//!
//! Requests that change something must carry the header `x-mqkv-dashboard: 1`, which a page
//! of another site cannot add without asking first (and is never allowed to).

mod feed;
pub mod series;
pub mod viewers;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use mqkv_broker::Broker;
use mqkv_protocol::{Command, Response};
use mqkv_raft::StoreNode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::statestore::{now_ms, Notifier, StateStoreService};
use series::Series;
use viewers::{Viewer, Viewers};

/// Most records one keys page returns.
const MAX_PAGE: usize = 500;

/// Value bytes a keys page shows of each record.
const SHOWN_VALUE_BYTES: usize = 4096;

/// The header every changing request carries.
const CHANGE_HEADER: &str = "x-mqkv-dashboard";

/// What the dashboard reads and acts through.
pub struct Dashboard {
    pub broker: Broker,
    pub node: StoreNode,
    pub service: Arc<StateStoreService>,
    pub notifier: Arc<Notifier>,
    pub viewers: Arc<Viewers>,
    pub series: Arc<Series>,
    pub started: Instant,
}

/// The dashboard's routes.
pub fn routes(d: Arc<Dashboard>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/dashboard.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/dashboard.css",
            get(|| async { asset(STYLES, "text/css; charset=utf-8") }),
        )
        .route("/api/me", get(me))
        .route("/api/login", post(login))
        .route("/api/logout", post(logout))
        .route("/api/overview", get(overview))
        .route("/api/keys", get(keys))
        .route("/api/keys/set", post(set_key))
        .route("/api/keys/delete", post(delete_key))
        .route("/api/feed", get(feed_page))
        .route("/api/clients", get(clients))
        .route("/api/cluster", get(cluster))
        .route("/api/series", get(series_page))
        .with_state(d)
}

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLES: &str = include_str!("assets/dashboard.css");

fn asset(body: &'static str, content_type: &'static str) -> HttpResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn error(status: StatusCode, message: &str) -> HttpResponse {
    (status, Json(json!({ "error": message }))).into_response()
}

/// A request refused before it was looked at.
struct Refused(StatusCode, &'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> HttpResponse {
        error(self.0, self.1)
    }
}

/// The viewer making a request, or the answer that tells the page to log in.
fn viewer(d: &Dashboard, headers: &HeaderMap, peer: SocketAddr) -> Result<Viewer, Refused> {
    let token = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(viewers::token_in);
    d.viewers.viewer(token, peer).ok_or(Refused(
        StatusCode::UNAUTHORIZED,
        "log in to see the dashboard",
    ))
}

/// A changing request must carry [`CHANGE_HEADER`].
fn changing(headers: &HeaderMap) -> Result<(), Refused> {
    if headers.get(CHANGE_HEADER).is_some() {
        Ok(())
    } else {
        Err(Refused(
            StatusCode::FORBIDDEN,
            "changing requests need the x-mqkv-dashboard header",
        ))
    }
}

/// Bytes as the page shows them: as text when they are printable UTF-8, always as hex.
pub(crate) fn shown(bytes: &[u8]) -> Value {
    let text = std::str::from_utf8(bytes).ok().filter(|t| {
        !t.chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    });
    json!({ "text": text, "hex": hex_lower(bytes), "size": bytes.len() })
}

fn hex_lower(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

async fn me(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> HttpResponse {
    let login_required = d.viewers.login_required();
    match viewer(&d, &headers, peer) {
        Ok(v) => Json(json!({
            "user": v.principal.username.as_deref(),
            "logged_in": v.logged_in,
            "login_required": login_required,
            "policy": d.broker.grants_for("", &v.principal).is_some(),
        }))
        .into_response(),
        Err(_) => Json(json!({
            "user": null,
            "logged_in": false,
            "login_required": login_required,
            "allowed": false,
        }))
        .into_response(),
    }
}

#[derive(Deserialize)]
struct Login {
    username: String,
    password: String,
}

async fn login(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Json(form): Json<Login>,
) -> HttpResponse {
    if let Err(refused) = changing(&headers) {
        return refused.into_response();
    }
    let local = d.local_addr(peer);
    match d
        .viewers
        .login(form.username.clone(), form.password, peer, local)
        .await
    {
        Some(token) => {
            tracing::info!(user = %form.username, %peer, "dashboard login");
            let cookie = format!(
                "{}={token}; Path=/; HttpOnly; SameSite=Strict",
                viewers::COOKIE
            );
            (
                [(header::SET_COOKIE, cookie)],
                Json(json!({ "user": form.username })),
            )
                .into_response()
        }
        None => {
            tracing::info!(user = %form.username, %peer, "dashboard login refused");
            tokio::time::sleep(viewers::FAILED_LOGIN_DELAY).await;
            error(StatusCode::UNAUTHORIZED, "wrong user name or password")
        }
    }
}

async fn logout(State(d): State<Arc<Dashboard>>, headers: HeaderMap) -> HttpResponse {
    if let Err(refused) = changing(&headers) {
        return refused.into_response();
    }
    if let Some(token) = headers
        .get(header::COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(viewers::token_in)
    {
        d.viewers.logout(token);
    }
    let cookie = format!("{}=; Path=/; Max-Age=0", viewers::COOKIE);
    ([(header::SET_COOKIE, cookie)], Json(json!({}))).into_response()
}

impl Dashboard {
    /// The address a viewer reached (for authentication's anonymous rule): the HTTP
    /// listener's, as seen from `peer`.
    fn local_addr(&self, peer: SocketAddr) -> SocketAddr {
        // A loopback peer reached a loopback address; any other peer did not.
        if peer.ip().is_loopback() {
            SocketAddr::from(([127, 0, 0, 1], 0))
        } else {
            SocketAddr::from(([0, 0, 0, 0], 0))
        }
    }
}

async fn overview(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(refused) = viewer(&d, &headers, peer) {
        return refused.into_response();
    }
    let (keys, bytes, limits) = d.node.read(|m| (m.len(), m.stored_bytes(), m.limits()));
    let b = d.broker.stats();
    let raft = d.node.raft_figures();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": d.started.elapsed().as_secs(),
        "keys": keys,
        "max_keys": limits.max_keys,
        "stored_bytes": bytes,
        "max_bytes": limits.max_bytes,
        "connected": b.connected_sessions,
        "sessions": b.total_sessions,
        "subscriptions": b.total_subscriptions,
        "retained": b.retained_messages,
        "publishes_received": b.publishes_received,
        "publishes_sent": b.publishes_sent,
        "clustered": d.node.is_clustered(),
        "leader": raft.leader,
        "term": raft.term,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct KeysQuery {
    pattern: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
}

async fn keys(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(q): Query<KeysQuery>,
) -> HttpResponse {
    let v = match viewer(&d, &headers, peer) {
        Ok(v) => v,
        Err(refused) => return refused.into_response(),
    };
    let pattern = q
        .pattern
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "*".to_owned());
    let after = match q.after.as_deref().filter(|a| !a.is_empty()) {
        Some(hex) => match hex_decode(hex) {
            Some(key) => Some(key),
            None => return error(StatusCode::BAD_REQUEST, "after: not a hex key"),
        },
        None => None,
    };
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_PAGE);
    if d.node.is_clustered() {
        if let Err(e) = d.node.linearizable().await {
            return error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
        }
    }
    let now = now_ms();
    let page = d.node.read(|m| {
        m.browse(pattern.as_bytes(), after.as_deref(), limit, now, |key| {
            v.may_use(key, false)
        })
    });
    let records: Vec<Value> = page
        .records
        .iter()
        .map(|r| {
            let shown_value = &r.value[..r.value.len().min(SHOWN_VALUE_BYTES)];
            json!({
                "key": shown(&r.key),
                "value": shown(shown_value),
                "size": r.value.len(),
                "version": r.version.to_text(),
                "fencing_token": r.fencing_token.as_ref().map(mqkv_protocol::Hlc::to_text),
                "ttl_ms": r.expires_at_ms.map(|at| at.saturating_sub(now)),
                "may_write": v.may_use(&r.key, true),
            })
        })
        .collect();
    Json(json!({
        "records": records,
        "next_after": page.next_after.as_deref().map(hex_lower),
        "may_write": v.logged_in,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct SetForm {
    key: String,
    value: String,
    px_ms: Option<u64>,
}

#[derive(Deserialize)]
struct DeleteForm {
    key: String,
}

async fn set_key(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Json(form): Json<SetForm>,
) -> HttpResponse {
    let command = Command::Set {
        key: Bytes::from(form.key),
        value: Bytes::from(form.value),
        condition: None,
        px_ms: form.px_ms.filter(|px| *px > 0),
    };
    change(&d, peer, &headers, command).await
}

async fn delete_key(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Json(form): Json<DeleteForm>,
) -> HttpResponse {
    let command = Command::Del {
        key: Bytes::from(form.key),
    };
    change(&d, peer, &headers, command).await
}

/// A SET or DEL made as the viewer, answered as the store answered it.
async fn change(
    d: &Dashboard,
    peer: SocketAddr,
    headers: &HeaderMap,
    command: Command,
) -> HttpResponse {
    if let Err(refused) = changing(headers) {
        return refused.into_response();
    }
    let v = match viewer(d, headers, peer) {
        Ok(v) => v,
        Err(refused) => return refused.into_response(),
    };
    if !v.logged_in {
        return error(StatusCode::FORBIDDEN, "log in to change keys");
    }
    tracing::info!(user = ?v.principal.username, command = command.verb(), "dashboard change");
    match d.service.local_request(&command, v.identity.clone()).await {
        Ok((Response::Error(kind), _)) => error(
            if kind == mqkv_protocol::ErrorKind::NotAuthorized {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::BAD_REQUEST
            },
            &kind.to_string(),
        ),
        Ok((response, version)) => Json(json!({
            "answer": String::from_utf8_lossy(&response.encode()).trim_end(),
            "version": version.map(|v| v.to_text()),
        }))
        .into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, &e),
    }
}

async fn feed_page(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> HttpResponse {
    let v = match viewer(&d, &headers, peer) {
        Ok(v) => v,
        Err(refused) => return refused.into_response(),
    };
    let keys: Vec<String> = match q.get("keys").map(|k| serde_json::from_str(k)) {
        Some(Ok(keys)) => keys,
        _ => return error(StatusCode::BAD_REQUEST, "keys: a JSON array of key names"),
    };
    if keys.is_empty() || keys.len() > feed::MAX_KEYS {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("keys: from 1 to {} keys", feed::MAX_KEYS),
        );
    }
    feed::feed(d.clone(), v.identity, keys)
        .await
        .into_response()
}

async fn clients(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(refused) = viewer(&d, &headers, peer) {
        return refused.into_response();
    }
    Json(json!({ "sessions": d.broker.sessions() })).into_response()
}

async fn cluster(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(refused) = viewer(&d, &headers, peer) {
        return refused.into_response();
    }
    if !d.node.is_clustered() {
        let raft = d.node.raft_figures();
        return Json(json!({
            "clustered": false,
            "nodes": [{
                "id": d.node.node_id(),
                "role": if raft.is_leader { "leader" } else { "follower" },
                "term": raft.term,
                "applied": raft.applied_index,
            }],
        }))
        .into_response();
    }
    match d.node.cluster_status().await {
        Some(status) => Json(json!({ "clustered": true, "status": status })).into_response(),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the cluster did not answer",
        ),
    }
}

async fn series_page(
    State(d): State<Arc<Dashboard>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> HttpResponse {
    if let Err(refused) = viewer(&d, &headers, peer) {
        return refused.into_response();
    }
    Json(json!({
        "every_ms": series::EVERY.as_millis() as u64,
        "samples": d.series.samples(),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_show_as_text_only_when_printable() {
        assert_eq!(shown(b"hello\n")["text"], "hello\n");
        assert_eq!(shown(b"a\x00b")["text"], Value::Null);
        assert_eq!(shown(b"\xff")["text"], Value::Null);
        assert_eq!(shown(b"\xff")["hex"], "ff");
        assert_eq!(shown(b"ab")["size"], 2);
    }

    #[test]
    fn hex_keys_decode_or_are_refused() {
        assert_eq!(hex_decode("6b31"), Some(b"k1".to_vec()));
        assert_eq!(hex_decode("6B"), Some(b"k".to_vec()));
        assert_eq!(hex_decode("6"), None);
        assert_eq!(hex_decode("zz"), None);
        assert_eq!(hex_decode("é1"), None);
    }
}
