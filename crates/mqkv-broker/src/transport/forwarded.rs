//! The client's address behind an HTTP reverse proxy (nginx, Envoy, a cloud application
//! gateway): a proxy that forwards a WebSocket upgrade adds the address it took the request
//! from to `X-Forwarded-For`, or to `Forwarded` (RFC 7239). On a WebSocket listener that
//! trusts such headers, the client is the last address in them that is not one of the trusted
//! proxies: addresses further left were written by whoever sent the request, and prove
//! nothing.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use super::proxy::{canonical, networks};

/// A WebSocket listener's trust in forwarding headers: from proxies at `from` (any, when
/// empty: then only the last address, the one the proxy itself saw, is taken).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forwarded {
    pub from: Vec<IpNet>,
}

impl Forwarded {
    /// Trust in headers from proxies at `from`: addresses (`10.0.0.5`) or networks
    /// (`10.0.0.0/8`).
    pub fn new<S: AsRef<str>>(from: &[S]) -> Result<Forwarded, String> {
        Ok(Forwarded {
            from: networks(from)?,
        })
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.from.iter().any(|net| net.contains(&ip))
    }

    /// The client behind the proxy at `peer`, from the values of the request's `Forwarded`
    /// headers (taken when there are any) or else its `X-Forwarded-For` headers, in order.
    pub fn client(
        &self,
        peer: SocketAddr,
        forwarded: &[String],
        x_forwarded_for: &[String],
    ) -> Result<SocketAddr, &'static str> {
        if !self.from.is_empty() && !self.trusts(peer.ip()) {
            return Err("not from a proxy the listener trusts (proxy_from)");
        }
        let hops: Vec<&str> = if forwarded.is_empty() {
            x_forwarded_for
                .iter()
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .collect()
        } else {
            forwarded
                .iter()
                .flat_map(|v| v.split(','))
                .filter_map(|element| {
                    element.split(';').find_map(|pair| {
                        let (name, value) = pair.split_once('=')?;
                        name.trim()
                            .eq_ignore_ascii_case("for")
                            .then(|| value.trim().trim_matches('"'))
                    })
                })
                .collect()
        };
        let mut client = None;
        for hop in hops.iter().rev() {
            let addr = parse_hop(hop)
                .ok_or("an address in X-Forwarded-For or Forwarded that is not one")?;
            client = Some(addr);
            if self.from.is_empty() || !self.trusts(addr.ip()) {
                break;
            }
        }
        client.ok_or("no X-Forwarded-For or Forwarded header from the proxy")
    }
}

/// One forwarded address: `192.0.2.7`, `192.0.2.7:51000`, `2001:db8::7`, `[2001:db8::7]` or
/// `[2001:db8::7]:51000` (port 0 when none is given).
fn parse_hop(hop: &str) -> Option<SocketAddr> {
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr);
    }
    let bare = hop
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(hop);
    bare.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0))
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
        let f = Forwarded::new(&["10.0.0.0/8"]).expect("settings");
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
    fn forwarded_is_read_before_x_forwarded_for() {
        let f = Forwarded::new(&["10.0.0.0/8"]).expect("settings");
        let fwd = strings(&[
            r#"for=198.51.100.9;proto=https, for="[2001:db8::7]:4711""#,
            "For=10.0.0.3;by=10.0.0.2",
        ]);
        let xff = strings(&["192.0.2.1"]);
        assert_eq!(
            f.client(addr(PROXY), &fwd, &xff),
            Ok(addr("[2001:db8::7]:4711"))
        );
    }

    #[test]
    fn trusting_any_proxy_takes_the_last_address_only() {
        let f = Forwarded::default();
        let xff = strings(&["127.0.0.1, 203.0.113.7"]);
        assert_eq!(
            f.client(addr("192.0.2.50:1"), &[], &xff),
            Ok(addr("203.0.113.7:0"))
        );
    }

    #[test]
    fn what_cannot_be_trusted_is_refused() {
        let f = Forwarded::new(&["10.0.0.0/8"]).expect("settings");
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
        let fwd = strings(&["for=unknown"]);
        assert!(f.client(addr(PROXY), &fwd, &[]).is_err());
        assert!(Forwarded::new(&["10.0.0.0/99"]).is_err());
    }
}
