//! Helpers shared by the tests and the benchmark.

use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(feature = "pki")]
pub mod pki;

/// The lowest port [`free_port`] hands out.
const LOW: u32 = 10_000;
/// How many ports [`free_port`] chooses among: up to the kernel's ephemeral range, which starts
/// at 32768 on Linux.
const SPAN: u32 = 22_000;

/// A port nobody listens on now, for a listener whose address must be known before it starts
/// (a cluster node's address is given to its peers).
///
/// The port is chosen below the ephemeral range, so a socket bound to port 0 elsewhere (another
/// test's server, an outgoing connection) cannot take it between this choice and the node's own
/// bind. Each process starts probing at its own offset and never hands out a port twice, so two
/// tests choosing at once rarely meet either.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    loop {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(step < SPAN, "no free port below the ephemeral range");
        let port = (LOW + (start + step) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_bindable_and_never_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        for port in ports {
            assert!((LOW..LOW + SPAN).contains(&u32::from(port)), "port {port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("bindable");
        }
    }
}
