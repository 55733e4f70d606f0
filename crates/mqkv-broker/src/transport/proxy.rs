//! The PROXY protocol (HAProxy's, version 1 text and version 2 binary): a load balancer or
//! reverse proxy in front of a listener starts each connection with a header that names the
//! client's address and the address the client connected to. On a listener that expects it,
//! the broker reads that header before anything else (TLS, WebSocket, MQTT) and takes the
//! client for what it says: its address for logs, per-address limits and the dashboard, and
//! the address it connected to for the rule that lets anonymous clients in on loopback only.
//!
//! Only the header is read: for version 2, its fixed 16 bytes and then the length they give;
//! for version 1, up to its line end, a byte at a time (at most 107). What follows stays in the
//! socket for the transport's handshake.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The first twelve bytes of a version 2 header.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest version 1 header, its line end included.
const V1_MAX: usize = 107;

/// The longest version 2 header the broker takes: addresses and a few type-length-values
/// (a TLS summary, a unique id, a cloud load balancer's endpoint id) fit well within it.
const V2_MAX: usize = 16 + 2048;

/// What a header says: the client's address and the address it connected to, or `None` when
/// it names none and the connection's own addresses stand.
pub type ClientAddresses = Option<(SocketAddr, SocketAddr)>;

/// A listener's PROXY protocol settings: every connection starts with a header, and only these
/// sources may send one (any, when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyProtocol {
    pub from: Vec<IpNet>,
}

impl ProxyProtocol {
    /// Settings for proxies at `from`: addresses (`10.0.0.5`) or networks (`10.0.0.0/8`).
    pub fn new<S: AsRef<str>>(from: &[S]) -> Result<ProxyProtocol, String> {
        Ok(ProxyProtocol {
            from: networks(from)?,
        })
    }

    /// Whether a connection from `ip` may send a header.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.from.is_empty() || self.from.iter().any(|net| net.contains(&ip))
    }

    /// Reads the header a connection from `peer` to `local` starts with. Returns the
    /// client's address and the address it connected to: those the header names, or the
    /// connection's own where it names none (a proxy's own health check, or a family other
    /// than TCP over IPv4 or IPv6). A loopback address in the header is the proxy's own
    /// machine: it stands only from a proxy on loopback (see [`vouched`]).
    pub(crate) async fn read<R: AsyncRead + Unpin>(
        &self,
        r: &mut R,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<(SocketAddr, SocketAddr), ProxyError> {
        if !self.trusts(peer.ip()) {
            return Err(ProxyError::Untrusted);
        }
        Ok(match read_header(r).await? {
            Some((client, server)) => (
                vouched(client, peer.ip(), peer),
                vouched(server, peer.ip(), local),
            ),
            None => (peer, local),
        })
    }
}

/// Addresses (`10.0.0.5`) and networks (`10.0.0.0/8`), as given in `proxy_from`; IPv4
/// networks mapped into IPv6 (`::ffff:10.0.0.0/104`) as IPv4, as addresses are compared.
pub(crate) fn networks<S: AsRef<str>>(from: &[S]) -> Result<Vec<IpNet>, String> {
    from.iter()
        .map(|s| {
            let s = s.as_ref().trim();
            let net = s
                .parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    format!("{s:?} is not an address or network (10.0.0.5, 10.0.0.0/8)")
                })?;
            Ok(match net {
                IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
                    Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                        .map(IpNet::V4)
                        .map_err(|e| format!("{s:?}: {e}"))?,
                    None => net,
                },
                net => net,
            })
        })
        .collect()
}

/// An address that the proxy at `proxy` names, `claimed`, as taken: IPv4 mapped into IPv6
/// as IPv4, and a loopback address, which means the proxy's own machine, as `otherwise`
/// unless the proxy is on loopback itself. (A remote proxy's loopback is not this machine's.)
pub(crate) fn vouched(claimed: SocketAddr, proxy: IpAddr, otherwise: SocketAddr) -> SocketAddr {
    let claimed = SocketAddr::new(canonical(claimed.ip()), claimed.port());
    if claimed.ip().is_loopback() && !canonical(proxy).is_loopback() {
        otherwise
    } else {
        claimed
    }
}

/// An IPv4 address mapped into IPv6 as plain IPv4, so that `10.0.0.0/8` covers it.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why a connection's PROXY header was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("not from a proxy the listener trusts (proxy_from)")]
    Untrusted,
    #[error("no PROXY protocol header")]
    Missing,
    #[error("PROXY protocol header longer than {0} bytes")]
    TooLong(usize),
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one header (version 1 or 2) from the start of `r`; see [`ProxyProtocol::read`].
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<ClientAddresses, ProxyError> {
    // Twelve bytes are in every header: a version 1 header has at least fifteen.
    let mut head = vec![0u8; 12];
    r.read_exact(&mut head).await?;
    if head == V2_SIGNATURE {
        head.resize(16, 0);
        r.read_exact(&mut head[12..]).await?;
        let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
        if 16 + len > V2_MAX {
            return Err(ProxyError::TooLong(V2_MAX));
        }
        head.resize(16 + len, 0);
        r.read_exact(&mut head[16..]).await?;
    } else if head.starts_with(b"PROXY ") {
        while !head.ends_with(b"\r\n") {
            if head.len() == V1_MAX {
                return Err(ProxyError::TooLong(V1_MAX));
            }
            let mut byte = [0u8];
            r.read_exact(&mut byte).await?;
            head.push(byte[0]);
        }
    } else {
        return Err(ProxyError::Missing);
    }
    parse(&head)
}

/// The addresses of one complete header (as [`read_header`] frames it).
pub fn parse(header: &[u8]) -> Result<ClientAddresses, ProxyError> {
    let malformed = |e: &dyn std::fmt::Display| ProxyError::Malformed(e.to_string());
    if header.starts_with(&V2_SIGNATURE) {
        use ppp::v2::{Addresses, Command, Header, Protocol};
        let h = Header::try_from(header).map_err(|e| malformed(&e))?;
        if h.command == Command::Local || h.protocol != Protocol::Stream {
            return Ok(None);
        }
        Ok(match h.addresses {
            Addresses::IPv4(a) => Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
            Addresses::IPv6(a) => Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
            _ => None,
        })
    } else {
        use ppp::v1::{Addresses, Header};
        let h = Header::try_from(header).map_err(|e| malformed(&e))?;
        Ok(match h.addresses {
            Addresses::Tcp4(a) => Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
            Addresses::Tcp6(a) => Some((
                SocketAddr::from((a.source_address, a.source_port)),
                SocketAddr::from((a.destination_address, a.destination_port)),
            )),
            Addresses::Unknown => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    /// Reads a header from `bytes`; returns the addresses and what is left unread.
    fn read(bytes: &[u8]) -> (Result<ClientAddresses, ProxyError>, Vec<u8>) {
        let mut r = bytes;
        let result = run(read_header(&mut r));
        (result, r.to_vec())
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    fn v2(command: u8, family: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(command);
        h.push(family);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn version_1_gives_the_addresses_and_leaves_what_follows() {
        let (got, rest) = read(b"PROXY TCP4 203.0.113.7 192.0.2.1 51000 8883\r\n\x10\x0b");
        let got = got.expect("a header");
        assert_eq!(
            got,
            Some((addr("203.0.113.7:51000"), addr("192.0.2.1:8883")))
        );
        assert_eq!(rest, b"\x10\x0b");
        let (got, _) = read(b"PROXY TCP6 2001:db8::7 2001:db8::1 51000 443\r\n");
        let got = got.expect("a header");
        assert_eq!(
            got,
            Some((addr("[2001:db8::7]:51000"), addr("[2001:db8::1]:443")))
        );
        // The shortest header: the connection's own addresses stand, and nothing more is read.
        let (got, rest) = read(b"PROXY UNKNOWN\r\nMQTT");
        assert_eq!(got.expect("a header"), None);
        assert_eq!(rest, b"MQTT");
    }

    #[test]
    fn version_2_gives_the_addresses_and_leaves_what_follows() {
        let mut body = vec![203, 0, 113, 7, 127, 0, 0, 1];
        body.extend_from_slice(&51000u16.to_be_bytes());
        body.extend_from_slice(&1883u16.to_be_bytes());
        // A type-length-value after the addresses (a no-op) is skipped.
        body.extend_from_slice(&[0x04, 0, 2, 0, 0]);
        let mut bytes = v2(0x21, 0x11, &body);
        bytes.extend_from_slice(b"\x10\x0b");
        let (got, rest) = read(&bytes);
        let got = got.expect("a header");
        assert_eq!(
            got,
            Some((addr("203.0.113.7:51000"), addr("127.0.0.1:1883")))
        );
        assert_eq!(rest, b"\x10\x0b");
        // LOCAL: the proxy's own connection (a health check).
        let (got, rest) = read(&[v2(0x20, 0x00, &[]), b"x".to_vec()].concat());
        assert_eq!(got.expect("a header"), None);
        assert_eq!(rest, b"x");
    }

    #[test]
    fn connections_without_a_valid_header_are_refused() {
        let cases: Vec<Vec<u8>> = vec![
            b"\x10\x0b\x00\x04MQTT\x05\x02\x00\x3c\x00".to_vec(),
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x00".to_vec(),
            b"GET /mqtt HTTP/1.1\r\n".to_vec(),
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n".to_vec(),
            b"PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n".to_vec(),
            [b"PROXY TCP4 ".to_vec(), vec![b'1'; 200]].concat(),
            v2(0x21, 0x11, &[1, 2, 3]),
            v2(0x31, 0x11, &[0; 12]),
        ];
        for case in cases {
            let (got, _) = read(&case);
            assert!(got.is_err(), "{case:?} taken: {got:?}");
        }
        let (got, _) = read(b"PROXY TCP4 ");
        assert!(matches!(got, Err(ProxyError::Io(_))), "cut short: {got:?}");
        let mut long = V2_SIGNATURE.to_vec();
        long.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        let (got, _) = read(&long);
        assert!(matches!(got, Err(ProxyError::TooLong(_))), "{got:?}");
    }

    #[test]
    fn loopback_in_a_header_means_the_proxys_machine() {
        let any = ProxyProtocol::default();
        let read = |header: &[u8], peer: &str| {
            run(any.read(&mut &header[..], addr(peer), addr("192.0.2.1:1884"))).expect("taken")
        };
        let header = b"PROXY TCP4 127.0.0.1 127.0.0.1 5000 1883\r\n";
        // From a proxy on another machine: its loopback is not ours.
        assert_eq!(
            read(header, "10.0.0.2:40000"),
            (addr("10.0.0.2:40000"), addr("192.0.2.1:1884"))
        );
        // From a proxy on this machine it is.
        assert_eq!(
            read(header, "127.0.0.1:40000"),
            (addr("127.0.0.1:5000"), addr("127.0.0.1:1883"))
        );
        // IPv4 mapped into IPv6 is IPv4.
        let header = b"PROXY TCP6 ::ffff:203.0.113.7 ::ffff:192.0.2.1 5000 1883\r\n";
        assert_eq!(
            read(header, "10.0.0.2:40000"),
            (addr("203.0.113.7:5000"), addr("192.0.2.1:1883"))
        );
        // The proxy's own health check: the connection's addresses.
        let local = [V2_SIGNATURE.as_slice(), &[0x20, 0, 0, 0]].concat();
        assert_eq!(
            read(&local, "10.0.0.2:40000"),
            (addr("10.0.0.2:40000"), addr("192.0.2.1:1884"))
        );
    }

    #[test]
    fn only_listed_proxies_may_send_a_header() {
        let any = ProxyProtocol::new::<&str>(&[]).expect("settings");
        assert!(any.trusts("198.51.100.1".parse().expect("ip")));
        let some = ProxyProtocol::new(&["10.0.0.0/8", "192.0.2.5", "fd00::/8"]).expect("settings");
        assert!(some.trusts("10.1.2.3".parse().expect("ip")));
        assert!(some.trusts("192.0.2.5".parse().expect("ip")));
        assert!(some.trusts("::ffff:10.9.9.9".parse().expect("ip")));
        assert!(some.trusts("fd12::1".parse().expect("ip")));
        assert!(!some.trusts("192.0.2.6".parse().expect("ip")));
        assert!(!some.trusts("127.0.0.1".parse().expect("ip")));
        let untrusted = run(some.read(
            &mut &b"PROXY UNKNOWN\r\n"[..],
            addr("192.0.2.9:4000"),
            addr("192.0.2.1:1883"),
        ));
        assert!(matches!(untrusted, Err(ProxyError::Untrusted)));
        assert!(ProxyProtocol::new(&["10.0.0.0/33"]).is_err());
        let mapped = ProxyProtocol::new(&["::ffff:10.0.0.0/104"]).expect("settings");
        assert!(mapped.trusts("10.1.2.3".parse().expect("ip")));
        assert!(mapped.trusts("::ffff:10.1.2.3".parse().expect("ip")));
        assert!(ProxyProtocol::new(&["proxy.internal"]).is_err());
    }
}
