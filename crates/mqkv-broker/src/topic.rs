//! Topic names, topic filters and shared subscription syntax (specification section 4.7 and 4.8).

/// A topic name a client may publish to: non-empty, no wildcards.
pub fn valid_topic_name(t: &str) -> bool {
    // Bytes, not chars: both wildcards are ASCII, and no byte of a multi-byte UTF-8 sequence is.
    !t.is_empty() && t.len() <= u16::MAX as usize && !has_wildcard(t)
}

/// Whether `t` holds a `+` or a `#` anywhere.
pub fn has_wildcard(t: &str) -> bool {
    memchr::memchr2(b'+', b'#', t.as_bytes()).is_some()
}

/// A topic filter: `#` only as the whole last level, `+` only as a whole level.
pub fn valid_topic_filter(f: &str) -> bool {
    if f.is_empty() || f.len() > u16::MAX as usize {
        return false;
    }
    let mut levels = f.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return false;
        }
        if level.contains('+') && level != "+" {
            return false;
        }
    }
    true
}

/// A parsed subscription filter: plain, or `$share/{group}/{filter}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterSpec<'a> {
    pub group: Option<&'a str>,
    pub filter: &'a str,
}

/// Splits and validates a subscription filter. `None` means the filter is invalid.
pub fn parse_filter(f: &str) -> Option<FilterSpec<'_>> {
    if let Some(rest) = f.strip_prefix("$share/") {
        let (group, filter) = rest.split_once('/')?;
        if group.is_empty() || has_wildcard(group) || !valid_topic_filter(filter) {
            return None;
        }
        Some(FilterSpec {
            group: Some(group),
            filter,
        })
    } else if f == "$share" || f.starts_with("$share/") {
        None
    } else if valid_topic_filter(f) {
        Some(FilterSpec {
            group: None,
            filter: f,
        })
    } else {
        None
    }
}

/// Whether `filter` matches `topic`. Topics starting with `$` are not matched by a filter whose
/// first level is a wildcard.
pub fn matches(filter: &str, topic: &str) -> bool {
    if !has_wildcard(filter) {
        return filter == topic;
    }
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether every topic `filter` matches is also matched by `outer`: a subscription to `filter`
/// can receive nothing that `outer` does not allow.
pub fn covers(outer: &str, filter: &str) -> bool {
    // `+` and `#` at the first level do not match `$` topics, which a literal first level of
    // `filter` may name.
    if filter.starts_with('$') && (outer.starts_with('+') || outer.starts_with('#')) {
        return false;
    }
    let mut o = outer.split('/');
    let mut f = filter.split('/');
    loop {
        match (o.next(), f.next()) {
            (Some("#"), _) => return true,
            // `a/#` matches `a` itself too, which only `a/#` (above) covers.
            (_, Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b && b != "+" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether some topic matches both filters.
pub fn intersects(a: &str, b: &str) -> bool {
    // A wildcard first level matches no `$` topic, which a literal first level may name.
    let dollar_literal = |f: &str| f.starts_with('$');
    let wild_first = |f: &str| f.starts_with('+') || f.starts_with('#');
    if (dollar_literal(a) && wild_first(b)) || (dollar_literal(b) && wild_first(a)) {
        return false;
    }
    let mut x = a.split('/');
    let mut y = b.split('/');
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            (Some("+"), Some(_)) | (Some(_), Some("+")) => {}
            (Some(p), Some(q)) if p == q => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersection_of_filters() {
        for (a, b) in [
            ("#", "a/b"),
            ("+/+", "a/+"),
            ("a/#", "a"),
            ("a/+", "+/b"),
            ("a/b", "a/b"),
            ("$SYS/#", "$SYS/+"),
            ("TopicA/B", "+/+"),
        ] {
            assert!(intersects(a, b), "{a} and {b}");
            assert!(intersects(b, a), "{b} and {a}");
        }
        for (a, b) in [
            ("a/b", "a/c"),
            ("a/+", "a"),
            ("+/+", "a/b/c"),
            ("#", "$SYS/x"),
            ("+/x", "$SYS/x"),
            ("test/nosubscribe", "TopicA/B"),
        ] {
            assert!(!intersects(a, b), "{a} and {b}");
            assert!(!intersects(b, a), "{b} and {a}");
        }
    }

    proptest::proptest! {
        /// A topic both filters match means they intersect.
        #[test]
        fn a_common_topic_means_intersection(
            a in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "+", "$s", "#"]), 1..4),
            b in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "+", "$s", "#"]), 1..4),
            topic in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "c", "$s"]), 1..5),
        ) {
            let a = a.join("/");
            let b = b.join("/");
            let topic = topic.join("/");
            if valid_topic_filter(&a) && valid_topic_filter(&b) && matches(&a, &topic) && matches(&b, &topic) {
                proptest::prop_assert!(intersects(&a, &b), "{} and {} both match {}", a, b, topic);
            }
        }
    }

    #[test]
    fn coverage_of_filters() {
        for (outer, filter) in [
            ("#", "a/b"),
            ("#", "#"),
            ("#", "+/x"),
            ("a/#", "a"),
            ("a/#", "a/#"),
            ("a/#", "a/+/c"),
            ("a/+", "a/b"),
            ("a/+", "a/+"),
            ("+/+", "a/+"),
            ("a/b", "a/b"),
            ("$SYS/#", "$SYS/x"),
        ] {
            assert!(covers(outer, filter), "{outer} should cover {filter}");
        }
        for (outer, filter) in [
            ("a/+", "a/#"),
            ("a/b", "a/+"),
            ("a/b", "a/#"),
            ("a/+", "a"),
            ("a/+/c", "a/+/+"),
            ("a/b/#", "a/#"),
            ("#", "$SYS/x"),
            ("+/x", "$SYS/x"),
            ("a", "a/b"),
            ("a/b", "a"),
        ] {
            assert!(!covers(outer, filter), "{outer} should not cover {filter}");
        }
    }

    proptest::proptest! {
        /// A covered filter matches no topic its cover does not.
        #[test]
        fn covering_means_matching(
            outer in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "+", "$s"]), 1..4),
            outer_hash in proptest::bool::ANY,
            filter in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "+", "$s"]), 1..4),
            filter_hash in proptest::bool::ANY,
            topic in proptest::collection::vec(proptest::sample::select(vec!["a", "b", "c", "$s"]), 1..6),
        ) {
            let join = |levels: &[&str], hash: bool| {
                let mut s = levels.join("/");
                if hash { s.push_str("/#"); }
                s
            };
            let outer = join(&outer, outer_hash);
            let filter = join(&filter, filter_hash);
            let topic = topic.join("/");
            if covers(&outer, &filter) && matches(&filter, &topic) {
                proptest::prop_assert!(matches(&outer, &topic), "{} covers {} but not {}", outer, filter, topic);
            }
        }
    }

    #[test]
    fn filter_validation() {
        for ok in ["a", "a/b", "+", "#", "a/+/b", "a/#", "+/+", "/", "$SYS/#"] {
            assert!(valid_topic_filter(ok), "{ok}");
        }
        for bad in ["", "a/#/b", "a+", "#a", "a/b#", "++"] {
            assert!(!valid_topic_filter(bad), "{bad}");
        }
    }

    #[test]
    fn shared_filters() {
        assert_eq!(
            parse_filter("$share/g/a/+"),
            Some(FilterSpec {
                group: Some("g"),
                filter: "a/+"
            })
        );
        assert_eq!(parse_filter("$share/g"), None);
        assert_eq!(parse_filter("$share//a"), None);
        assert_eq!(parse_filter("$share/g+/a"), None);
        assert_eq!(parse_filter("$share"), None);
    }

    #[test]
    fn matching() {
        assert!(matches("a/+/c", "a/b/c"));
        assert!(!matches("a/+/c", "a/b/d"));
        assert!(matches("a/#", "a"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("#", "a/b"));
        assert!(!matches("#", "$SYS/x"));
        assert!(!matches("+/x", "$SYS/x"));
        assert!(matches("$SYS/#", "$SYS/x"));
        assert!(matches("+", ""));
        assert!(matches("/+", "/a"));
        assert!(!matches("a", "a/b"));
        assert!(!matches("a/b", "a"));
    }
}
