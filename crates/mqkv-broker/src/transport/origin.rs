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

/// Why `entry` cannot be a listed origin, if it cannot: an origin is `*`, or
/// `http://` or `https://` and a host with its port if not the scheme's default, as a browser
/// sends it.
pub fn check(entry: &str) -> Result<(), String> {
    let origin = normal(entry);
    if origin == "*" {
        return Ok(());
    }
    let bad = |why: &str| Err(format!("allowed origin {entry:?}: {why}"));
    let Some((scheme, authority)) = origin.split_once("://") else {
        return bad("give it as scheme://host[:port], e.g. https://app.example");
    };
    if scheme != "http" && scheme != "https" {
        return bad("the scheme is http or https");
    }
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return bad("give only scheme://host[:port], without a path");
    }
    let default = if scheme == "https" { ":443" } else { ":80" };
    if authority.ends_with(default) {
        return bad("leave out the scheme's default port, as browsers do");
    }
    Ok(())
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

/// What an upgrade naming `origin`, sent to `host` (its `Host` header) over a listener with
/// TLS (`secure`) or without, comes from, for a listener that trusts `allowed`.
pub fn judge(origin: Option<&str>, host: Option<&str>, secure: bool, allowed: &Origins) -> Page {
    let Some(origin) = origin else {
        return Page::None;
    };
    let origin = normal(origin);
    let scheme = if secure { "https" } else { "http" };
    let own = host.is_some_and(|host| {
        let authority = match origin.split_once("://") {
            Some((s, rest)) if s == scheme => rest,
            _ => "",
        };
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
    fn listed_origins_are_checked() {
        for good in [
            "*",
            "https://app.example",
            "http://localhost:3000",
            "https://[::1]:8443/",
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        for bad in [
            "app.example",
            "ftp://app.example",
            "https://app.example/path",
            "https://app.example:443",
            "http://app.example:80",
            "null",
            "https://",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn clients_without_an_origin_are_not_pages() {
        assert_eq!(
            judge(None, Some("x:1"), false, &Origins::default()),
            Page::None
        );
        assert_eq!(
            judge(None, None, true, &Origins::new(["https://a"])),
            Page::None
        );
    }

    #[test]
    fn a_page_of_the_listeners_own_origin_is_trusted() {
        let none = Origins::default();
        let own = |origin: &str, host| {
            judge(Some(origin), Some(host), origin.starts_with("https"), &none)
        };
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
        // The page at port 80 is another origin than a secure listener at 443.
        assert_eq!(
            judge(Some("http://127.0.0.1"), Some("127.0.0.1"), true, &none),
            foreign("http://127.0.0.1")
        );
        assert_eq!(
            judge(Some("http://a"), None, false, &none),
            foreign("http://a")
        );
    }

    #[test]
    fn a_listed_origin_is_trusted_and_others_are_refused() {
        let listed = Origins::new(["https://app.example/", "HTTP://localhost:3000"]);
        let at = |origin| judge(Some(origin), Some("broker:8443"), true, &listed);
        assert_eq!(at("https://app.example"), Page::Trusted);
        assert_eq!(at("http://localhost:3000"), Page::Trusted);
        assert_eq!(at("https://evil.example"), Page::Refused);
        assert_eq!(at("https://broker:8443"), Page::Refused);
        assert_eq!(
            judge(
                Some("https://[fd00::1]:8443"),
                Some("[fd00::1]:8443"),
                true,
                &listed
            ),
            Page::Trusted
        );
        let any = Origins::new(["*"]);
        assert_eq!(
            judge(Some("https://evil.example"), None, true, &any),
            Page::Trusted
        );
    }
}
