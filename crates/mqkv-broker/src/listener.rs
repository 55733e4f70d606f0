//! Listeners: binding an address, and accepting connections on the connection threads.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::inner::Inner;
use crate::transport::{ProxyProtocol, Transport};

/// Binds a listener for clients that reach it over `transport` (each connection starting with
/// a PROXY protocol header if `proxy`) and serves MQTT on it until shutdown. Returns the bound
/// address. A few connection threads accept from it (see
/// [`crate::placement::ConnThreads::accepting`]).
pub(crate) async fn listen(
    inner: &Arc<Inner>,
    addr: SocketAddr,
    transport: Transport,
    proxy: Option<Arc<ProxyProtocol>>,
) -> std::io::Result<SocketAddr> {
    crate::transport::warn_if_exposed(addr, &transport);
    if !addr.ip().is_loopback() {
        if proxy.as_ref().is_some_and(|p| p.from.is_empty()) {
            tracing::warn!(%addr, "PROXY protocol listener that takes headers from anyone: a client that reaches it directly can claim any address; list the proxies in proxy_from");
        }
        if transport.forwarded().is_some_and(|f| f.from.is_empty()) {
            tracing::warn!(%addr, "WebSocket listener that takes a forwarding header from anyone: a client that reaches it directly can claim any address; list the proxies in proxy_from");
        }
    }
    let transport = Arc::new(transport);
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let listener = listener.into_std()?;
    for index in inner.threads.accepting() {
        // Registered here, so a thread that cannot watch the listener fails the call.
        let listener = inner.threads.listener_on(index, listener.try_clone()?)?;
        // Weak: the loop runs on a thread `inner` owns, so a strong reference would keep
        // a broker whose every handle was dropped accepting for ever.
        let weak = Arc::downgrade(inner);
        let shutdown = inner.shutdown.subscribe();
        inner.threads.spawn_on(
            index,
            accept_loop(
                weak,
                listener,
                local,
                transport.clone(),
                proxy.clone(),
                shutdown,
            ),
        );
    }
    Ok(local)
}

/// Accepts connections on the connection thread it runs on until shutdown, or until the broker
/// is gone (every handle dropped: its shutdown sender goes with it), each served where
/// [`ConnThreads::place`](crate::placement::ConnThreads::place) puts it.
async fn accept_loop(
    inner: std::sync::Weak<Inner>,
    listener: TcpListener,
    local: SocketAddr,
    transport: Arc<Transport>,
    proxy: Option<Arc<ProxyProtocol>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            // Shutdown first: a backlog of connections must not keep the loop accepting after
            // it, as each would join after the disconnect was sent and be waited for.
            biased;
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Some(inner) = inner.upgrade() else { break };
                    let _ = stream.set_nodelay(true);
                    let conn_inner = inner.clone();
                    let transport = transport.clone();
                    let proxy = proxy.clone();
                    inner.threads.place(stream, move |stream| {
                        crate::connection::run(conn_inner, stream, peer, local, transport, proxy)
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}
