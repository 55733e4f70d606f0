//! The client's address behind an HTTP reverse proxy (nginx, Envoy, a cloud application
//! gateway): a proxy that forwards a WebSocket upgrade adds the address it took the request
//! from to `X-Forwarded-For`, or to `Forwarded` (RFC 7239). A listener reads the one header its
//! proxy writes and ignores the other, which a client may have sent itself and the proxy passed
//! on. The client is the last address in it that is not one of the trusted proxies: addresses
//! further left were written by whoever sent the request, and prove nothing.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::proxy::{canonical, networks, vouched};

/// The header a proxy writes the client's address to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ForwardingHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, Envoy, cloud load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

impl std::str::FromStr for ForwardingHeader {
    type Err = String;

    fn from_str(s: &str) -> Result<ForwardingHeader, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ForwardingHeader::XForwardedFor),
            "forwarded" => Ok(ForwardingHeader::Forwarded),
            other => Err(format!(
                "forwarding header {other:?}: give \"X-Forwarded-For\" or \"Forwarded\""
            )),
        }
    }
}

/// A WebSocket listener's trust in a forwarding header: written by proxies at `from` (any,
/// when empty: then only the last address, the one the proxy itself saw, is taken).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forwarded {
    pub header: ForwardingHeader,
    pub from: Vec<IpNet>,
}

impl Forwarded {
    /// Trust in `header` from proxies at `from`: addresses (`10.0.0.5`) or networks
    /// (`10.0.0.0/8`).
    pub fn new<S: AsRef<str>>(header: ForwardingHeader, from: &[S]) -> Result<Forwarded, String> {
        Ok(Forwarded {
            header,
            from: networks(from)?,
        })
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.from.iter().any(|net| net.contains(&ip))
    }

    /// The client behind the proxy at `peer`, from the values of the request's `Forwarded`
    /// and `X-Forwarded-For` headers (each in order; only the listener's header is read). A
    /// loopback address is the proxy's own machine: it stands only from a proxy on loopback,
    /// and otherwise the client is taken to be at the proxy's address.
    pub fn client(
        &self,
        peer: SocketAddr,
        forwarded: &[String],
        x_forwarded_for: &[String],
    ) -> Result<SocketAddr, &'static str> {
        if !self.from.is_empty() && !self.trusts(peer.ip()) {
            return Err("not from a proxy the listener trusts (proxy_from)");
        }
        let hops: Vec<Option<&str>> = match self.header {
            ForwardingHeader::XForwardedFor => x_forwarded_for
                .iter()
                .flat_map(|v| v.split(','))
                .map(|hop| Some(hop.trim()))
                .collect(),
            // Each element must say whom it was for: one that does not is a hop of unknown
            // origin, and the walk cannot go past it.
            ForwardingHeader::Forwarded => forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .map(|element| {
                    element.split(';').find_map(|pair| {
                        let (name, value) = pair.split_once('=')?;
                        name.trim()
                            .eq_ignore_ascii_case("for")
                            .then(|| value.trim().trim_matches('"'))
                    })
                })
                .collect(),
        };
        let mut client = None;
        for hop in hops.iter().rev() {
            let addr = hop
                .and_then(parse_hop)
                .ok_or("a forwarded address that is not one")?;
            client = Some(addr);
            if self.from.is_empty() || !self.trusts(addr.ip()) {
                break;
            }
        }
        let client = client.ok_or(match self.header {
            ForwardingHeader::XForwardedFor => "no X-Forwarded-For header from the proxy",
            ForwardingHeader::Forwarded => "no Forwarded header from the proxy",
        })?;
        Ok(vouched(client, peer.ip(), peer))
    }
}

/// One forwarded address: `192.0.2.7`, `192.0.2.7:51000`, `2001:db8::7`, `[2001:db8::7]` or
/// `[2001:db8::7]:51000` (port 0 when none is given).
fn parse_hop(hop: &str) -> Option<SocketAddr> {
    let addr = hop.parse::<SocketAddr>().ok().or_else(|| {
        let bare = hop
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(hop);
        bare.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0))
    })?;
    Some(SocketAddr::new(canonical(addr.ip()), addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    const PROXY: &str = "10.0.0.2:40000";

    #[test]
    fn the_client_is_the_last_address_no_trusted_proxy_wrote() {
        let f = Forwarded::new(ForwardingHeader::XForwardedFor, &["10.0.0.0/8"]).expect("settings");
        let xff = strings(&["198.51.100.9, 203.0.113.7", "10.0.0.3"]);
        assert_eq!(f.client(addr(PROXY), &[], &xff), Ok(addr("203.0.113.7:0")));
        // With ports, and IPv6 in brackets.
        let xff = strings(&["203.0.113.7:51000"]);
        assert_eq!(
            f.client(addr(PROXY), &[], &xff),
            Ok(addr("203.0.113.7:51000"))
        );
        let xff = strings(&["[2001:db8::7]:51000, 10.1.1.1"]);
        assert_eq!(
            f.client(addr(PROXY), &[], &xff),
            Ok(addr("[2001:db8::7]:51000"))
        );
        // Every hop a trusted proxy: the first one.
        let xff = strings(&["10.9.9.9, 10.0.0.3"]);
        assert_eq!(f.client(addr(PROXY), &[], &xff), Ok(addr("10.9.9.9:0")));
    }

    #[test]
    fn only_the_listeners_header_is_read() {
        let fwd = strings(&[
            r#"for=198.51.100.9;proto=https, for="[2001:db8::7]:4711""#,
            "For=10.0.0.3;by=10.0.0.2",
        ]);
        let xff = strings(&["192.0.2.1"]);
        let f = Forwarded::new(ForwardingHeader::Forwarded, &["10.0.0.0/8"]).expect("settings");
        assert_eq!(
            f.client(addr(PROXY), &fwd, &xff),
            Ok(addr("[2001:db8::7]:4711"))
        );
        assert!(
            f.client(addr(PROXY), &[], &xff).is_err(),
            "no Forwarded header"
        );
        // A Forwarded header the client wrote itself is not read where X-Forwarded-For is.
        let f = Forwarded::new(ForwardingHeader::XForwardedFor, &["10.0.0.0/8"]).expect("settings");
        assert_eq!(f.client(addr(PROXY), &fwd, &xff), Ok(addr("192.0.2.1:0")));
        assert!(
            f.client(addr(PROXY), &fwd, &[]).is_err(),
            "no X-Forwarded-For header"
        );
        // An element without `for` is a hop nobody can vouch for.
        let f = Forwarded::new(ForwardingHeader::Forwarded, &["10.0.0.0/8"]).expect("settings");
        let fwd = strings(&["for=198.51.100.9, proto=https;by=10.0.0.2"]);
        assert!(f.client(addr(PROXY), &fwd, &[]).is_err());
    }

    #[test]
    fn a_loopback_client_stands_only_behind_a_proxy_on_loopback() {
        let f = Forwarded::new(
            ForwardingHeader::XForwardedFor,
            &["10.0.0.0/8", "127.0.0.1"],
        )
        .expect("settings");
        let xff = strings(&["127.0.0.1"]);
        assert_eq!(
            f.client(addr(PROXY), &[], &xff),
            Ok(addr(PROXY)),
            "the proxy's machine"
        );
        assert_eq!(
            f.client(addr("127.0.0.1:3000"), &[], &xff),
            Ok(addr("127.0.0.1:0"))
        );
        // IPv4 mapped into IPv6 is IPv4.
        let xff = strings(&["::ffff:203.0.113.7"]);
        assert_eq!(f.client(addr(PROXY), &[], &xff), Ok(addr("203.0.113.7:0")));
    }

    #[test]
    fn trusting_any_proxy_takes_the_last_address_only() {
        let f = Forwarded::default();
        let xff = strings(&["198.51.100.1, 203.0.113.7"]);
        assert_eq!(
            f.client(addr("192.0.2.50:1"), &[], &xff),
            Ok(addr("203.0.113.7:0"))
        );
    }

    #[test]
    fn what_cannot_be_trusted_is_refused() {
        let f = Forwarded::new(ForwardingHeader::XForwardedFor, &["10.0.0.0/8"]).expect("settings");
        let xff = strings(&["203.0.113.7"]);
        assert!(
            f.client(addr("192.0.2.50:1"), &[], &xff).is_err(),
            "not a listed proxy"
        );
        assert!(f.client(addr(PROXY), &[], &[]).is_err(), "no header");
        for bad in ["unknown", "_hidden", "203.0.113.7:port", "", "1.2.3.4.5"] {
            let xff = strings(&[bad]);
            assert!(f.client(addr(PROXY), &[], &xff).is_err(), "{bad:?} taken");
        }
        let f = Forwarded::new(ForwardingHeader::Forwarded, &["10.0.0.0/8"]).expect("settings");
        let fwd = strings(&["for=unknown"]);
        assert!(f.client(addr(PROXY), &fwd, &[]).is_err());
        assert!(Forwarded::new(ForwardingHeader::Forwarded, &["10.0.0.0/99"]).is_err());
        assert!("X-Real-IP".parse::<ForwardingHeader>().is_err());
        assert_eq!(
            "x-forwarded-for".parse(),
            Ok(ForwardingHeader::XForwardedFor)
        );
    }
}
