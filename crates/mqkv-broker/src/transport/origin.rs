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
        !authority.is_empty() && authority.eq_ignore_ascii_case(host.trim())
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
        assert_eq!(
            own("http://127.0.0.1:8080", "127.0.0.1:8080"),
            Page::Trusted
        );
        assert_eq!(
            own("https://Broker.Example/", "broker.example"),
            Page::Trusted
        );
        assert_eq!(
            own("http://127.0.0.1:9000", "127.0.0.1:8080"),
            Page::Foreign("http://127.0.0.1:9000".into())
        );
        assert_eq!(own("null", "null"), Page::Foreign("null".into()));
        assert_eq!(
            judge(Some("http://a"), None, &none),
            Page::Foreign("http://a".into())
        );
    }

    #[test]
    fn a_listed_origin_is_trusted_and_others_are_refused() {
        let listed = Origins::new(["https://app.example/", "HTTP://localhost:3000"]);
        let at = |origin| judge(Some(origin), Some("broker:8443"), &listed);
        assert_eq!(at("https://app.example"), Page::Trusted);
        assert_eq!(at("http://localhost:3000"), Page::Trusted);
        assert_eq!(at("https://evil.example"), Page::Refused);
        assert_eq!(at("https://broker:8443"), Page::Trusted);
        let any = Origins::new(["*"]);
        assert_eq!(
            judge(Some("https://evil.example"), None, &any),
            Page::Trusted
        );
    }
}
