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

#[cfg(test)]
mod tests {
    use super::*;

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
