//! Which web pages may use a WebSocket listener. A browser names the origin of the page a
//! WebSocket comes from in the upgrade request (`Origin`), and lets any page open a WebSocket
//! to any address, loopback included; other clients send no origin. So a page from another
//! site, open in a browser on the server's machine, is not a local client, even though its
//! connection comes from loopback.

/// The origins a WebSocket listener trusts besides its own: `scheme://host[:port]`, or `*`
/// for any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins(Vec<String>);

impl Origins {
    /// The origins given, compared without case and without a trailing `/`.
    pub fn new<S: AsRef<str>>(origins: impl IntoIterator<Item = S>) -> Origins {
        Origins(origins.into_iter().map(|o| normal(o.as_ref())).collect())
    }

    /// Whether none is listed: then a page of another origin may connect, but is not trusted
    /// as local.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn lists(&self, origin: &str) -> bool {
        self.0.iter().any(|o| o == "*" || *o == origin)
    }
}

fn normal(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Whether a `Host` (`name[:port]`) can only mean the machine the request reached: an IP
/// address or `localhost`. A page from a DNS name that a rebinding attack pointed at this
/// machine has that name as its origin and its `Host` alike, so a same-origin request to a
/// DNS name proves nothing.
fn names_itself(host: &str) -> bool {
    let host = host.trim();
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Where a WebSocket client runs, as far as the broker trusts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// No origin: not a browser page.
    None,
    /// A page of the listener's own origin, or of one it lists.
    Trusted,
    /// A page of another origin, which the listener lets connect as a remote client would.
    Foreign(String),
    /// A page of another origin, on a listener that lists the origins it takes.
    Refused,
}

/// What an upgrade naming `origin`, sent to `host` (its `Host` header), comes from, for a
/// listener that trusts `allowed`.
pub fn judge(origin: Option<&str>, host: Option<&str>, allowed: &Origins) -> Page {
    let Some(origin) = origin else {
        return Page::None;
    };
    let origin = normal(origin);
    let own = host.is_some_and(|host| {
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        !authority.is_empty() && authority.eq_ignore_ascii_case(host.trim()) && names_itself(host)
    });
    if own || allowed.lists(&origin) {
        Page::Trusted
    } else if allowed.is_empty() {
        Page::Foreign(origin)
    } else {
        Page::Refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_without_an_origin_are_not_pages() {
        assert_eq!(judge(None, Some("x:1"), &Origins::default()), Page::None);
        assert_eq!(judge(None, None, &Origins::new(["https://a"])), Page::None);
    }

    #[test]
    fn a_page_of_the_listeners_own_origin_is_trusted() {
        let none = Origins::default();
        let own = |origin, host| judge(Some(origin), Some(host), &none);
        let foreign = |origin: &str| Page::Foreign(origin.into());
        assert_eq!(
            own("http://127.0.0.1:8080", "127.0.0.1:8080"),
            Page::Trusted
        );
        assert_eq!(
            own("http://LOCALHOST:8080/", "localhost:8080"),
            Page::Trusted
        );
        assert_eq!(own("http://[::1]:8080", "[::1]:8080"), Page::Trusted);
        assert_eq!(own("https://10.1.2.3", "10.1.2.3"), Page::Trusted);
        assert_eq!(
            own("http://127.0.0.1:9000", "127.0.0.1:8080"),
            foreign("http://127.0.0.1:9000")
        );
        // A DNS name may have been pointed at this machine by the page's own site.
        assert_eq!(
            own("https://Broker.Example/", "broker.example"),
            foreign("https://broker.example")
        );
        assert_eq!(
            own("http://rebound.example:8080", "rebound.example:8080"),
            foreign("http://rebound.example:8080")
        );
        assert_eq!(own("null", "null"), foreign("null"));
        assert_eq!(judge(Some("http://a"), None, &none), foreign("http://a"));
    }

    #[test]
    fn a_listed_origin_is_trusted_and_others_are_refused() {
        let listed = Origins::new(["https://app.example/", "HTTP://localhost:3000"]);
        let at = |origin| judge(Some(origin), Some("broker:8443"), &listed);
        assert_eq!(at("https://app.example"), Page::Trusted);
        assert_eq!(at("http://localhost:3000"), Page::Trusted);
        assert_eq!(at("https://evil.example"), Page::Refused);
        assert_eq!(at("https://broker:8443"), Page::Refused);
        assert_eq!(
            judge(
                Some("https://[fd00::1]:8443"),
                Some("[fd00::1]:8443"),
                &listed
            ),
            Page::Trusted
        );
        let any = Origins::new(["*"]);
        assert_eq!(
            judge(Some("https://evil.example"), None, &any),
            Page::Trusted
        );
    }
}
