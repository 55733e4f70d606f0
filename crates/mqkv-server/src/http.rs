//! The HTTP listener: `/metrics` (Prometheus text), `/healthz` (the process serves),
//! `/readyz` (this node can serve state store writes now) and the web dashboard (see
//! [`crate::dashboard`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use crate::dashboard::{self, Dashboard};
use crate::metrics::{self, Sources};

/// A bound HTTP listener, serving until the server stops.
pub struct HttpListener {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl HttpListener {
    /// Binds `addr` and serves there.
    pub async fn start(
        addr: SocketAddr,
        sources: Sources,
        dashboard: Arc<Dashboard>,
    ) -> std::io::Result<HttpListener> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/metrics", get(metrics_page))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(Arc::new(sources))
            .merge(dashboard::routes(dashboard))
            .into_make_service_with_connect_info::<SocketAddr>();
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "the HTTP listener stopped");
            }
        });
        Ok(HttpListener { addr, stop })
    }

    /// Stops serving.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

async fn metrics_page(State(s): State<Arc<Sources>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&s),
    )
}

async fn healthz() -> impl IntoResponse {
    json(StatusCode::OK, r#"{"status":"ok"}"#.to_owned())
}

/// Ready while a leader is known: state store writes can be served now.
async fn readyz(State(s): State<Arc<Sources>>) -> impl IntoResponse {
    let raft = s.node.raft_figures();
    match raft.leader {
        Some(leader) => json(
            StatusCode::OK,
            format!(
                r#"{{"status":"ready","leader":{leader},"term":{}}}"#,
                raft.term
            ),
        ),
        None => json(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                r#"{{"status":"not ready","reason":"no leader known","term":{}}}"#,
                raft.term
            ),
        ),
    }
}

fn json(status: StatusCode, body: String) -> impl IntoResponse {
    (status, [(header::CONTENT_TYPE, "application/json")], body)
}
