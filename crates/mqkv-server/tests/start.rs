//! Starting a server that cannot bind every listener.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use mqkv_server::{Server, ServerConfig, StartError, StorageKind};

/// A loopback address nobody listens on (bound once, then released).
fn free_address() -> SocketAddr {
    let probe = TcpListener::bind("127.0.0.1:0").expect("bind");
    probe.local_addr().expect("addr")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_cannot_bind_stops_the_ones_already_bound() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let first = free_address();
    let config = ServerConfig {
        storage: StorageKind::Memory,
        listen: vec![first, taken.local_addr().expect("addr")],
        ..ServerConfig::default()
    };
    match Server::start(config).await {
        Err(StartError::Listen { addr, .. }) => assert_eq!(addr, taken.local_addr().unwrap()),
        Err(other) => panic!("expected a listen error, got {other}"),
        Ok(_) => panic!("started although an address was taken"),
    }
    // The first address was bound before the failure; it is released rather than left
    // accepting connections for a server that never started.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(first).is_ok() {
        assert!(
            Instant::now() < deadline,
            "{first} still accepts after the start failed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
