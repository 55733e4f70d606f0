//! SCAN patterns: fnmatch-style globs over binary keys.
//!
//! Invariant: for every pattern that `glob::Pattern` (default options)
//! accepts, and that has no `**`, matching a UTF-8 key gives the same answer
//! as `glob::Pattern::matches`, which is what the official SCAN tests use.
//!
//! Semantics:
//! - the pattern is anchored at both ends and case-sensitive;
//! - `*` matches any sequence, including the empty one and `/`; `**` is just
//!   two `*` (fnmatch), not glob's path-component wildcard;
//! - `?` matches exactly one character;
//! - `[abc]`, `[a-z]` are classes and `[!...]` negates; `^` is an ordinary
//!   member (unlike Redis), and `]` right after `[` or `[!` is a member;
//!   `-` is literal first or last; a reversed range matches nothing;
//! - `[*]`, `[?]`, `[[]` match the metacharacter literally; there is no
//!   backslash escape;
//! - a `[` without a closing `]` is a literal `[` (fnmatch), where the glob
//!   crate would refuse the pattern.
//!
//! Keys are arbitrary bytes. A "character" is a whole UTF-8 scalar where the
//! bytes are valid UTF-8, and a single byte where they are not, so `?`
//! matches `é` as one character yet binary keys still match byte by byte.
//! Bytes outside valid UTF-8 sort after every scalar inside ranges.

/// One matching unit: a Unicode scalar value, or `RAW_BYTE + b` for a byte
/// that is not part of valid UTF-8.
type Unit = u32;

/// First unit used for bytes that are not valid UTF-8; above `char::MAX`.
const RAW_BYTE: Unit = 0x11_0000;

/// Decodes the unit at the start of `bytes` and its length in bytes.
fn next_unit(bytes: &[u8]) -> Option<(Unit, usize)> {
    let first = *bytes.first()?;
    let width = match first {
        0x00..=0x7f => 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => 0,
    };
    if width > 0 {
        if let Some(Ok(text)) = bytes.get(..width).map(std::str::from_utf8) {
            if let Some(c) = text.chars().next() {
                return Some((Unit::from(c), width));
            }
        }
    }
    Some((RAW_BYTE + Unit::from(first), 1))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ClassItem {
    Single(Unit),
    Range(Unit, Unit),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(Unit),
    AnyOne,
    AnySequence,
    Class {
        negated: bool,
        items: Vec<ClassItem>,
    },
}

impl Token {
    fn matches_unit(&self, unit: Unit) -> bool {
        match self {
            Token::Literal(expected) => *expected == unit,
            Token::AnyOne => true,
            Token::AnySequence => false,
            Token::Class { negated, items } => {
                let inside = items.iter().any(|item| match *item {
                    ClassItem::Single(c) => c == unit,
                    ClassItem::Range(low, high) => low <= unit && unit <= high,
                });
                inside != *negated
            }
        }
    }
}

/// A compiled SCAN pattern. Compile once per SCAN, match every key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobPattern {
    tokens: Vec<Token>,
}

const STAR: Unit = '*' as Unit;
const QUESTION: Unit = '?' as Unit;
const OPEN: Unit = '[' as Unit;
const CLOSE: Unit = ']' as Unit;
const BANG: Unit = '!' as Unit;
const DASH: Unit = '-' as Unit;

impl GlobPattern {
    /// Compiles a pattern. Every byte string is a valid pattern.
    pub fn new(pattern: &[u8]) -> GlobPattern {
        let mut units = Vec::with_capacity(pattern.len());
        let mut rest = pattern;
        while let Some((unit, width)) = next_unit(rest) {
            units.push(unit);
            rest = &rest[width..];
        }

        let mut tokens = Vec::new();
        let mut i = 0;
        while i < units.len() {
            match units[i] {
                STAR => {
                    // Runs of `*` behave as one; keeping one keeps matching linear.
                    if tokens.last() != Some(&Token::AnySequence) {
                        tokens.push(Token::AnySequence);
                    }
                    i += 1;
                }
                QUESTION => {
                    tokens.push(Token::AnyOne);
                    i += 1;
                }
                OPEN => match parse_class(&units[i + 1..]) {
                    Some((token, used)) => {
                        tokens.push(token);
                        i += 1 + used;
                    }
                    None => {
                        tokens.push(Token::Literal(OPEN));
                        i += 1;
                    }
                },
                unit => {
                    tokens.push(Token::Literal(unit));
                    i += 1;
                }
            }
        }
        GlobPattern { tokens }
    }

    /// True if the whole `key` matches.
    ///
    /// Classic single-backtrack wildcard matching: only `*` consumes a
    /// variable amount, so remembering the most recent `*` is enough and the
    /// cost is at most `O(pattern × key)`, with no recursion.
    pub fn matches(&self, key: &[u8]) -> bool {
        let tokens = &self.tokens;
        let mut t = 0;
        let mut k = 0;
        // (token after the last `*`, key offset that `*` currently ends at)
        let mut backtrack: Option<(usize, usize)> = None;
        loop {
            if let Some(token) = tokens.get(t) {
                if *token == Token::AnySequence {
                    backtrack = Some((t + 1, k));
                    t += 1;
                    continue;
                }
                if let Some((unit, width)) = next_unit(&key[k..]) {
                    if token.matches_unit(unit) {
                        t += 1;
                        k += width;
                        continue;
                    }
                }
            } else if k == key.len() {
                return true;
            }
            // Mismatch: let the last `*` swallow one more unit and retry.
            let Some((after_star, star_end)) = backtrack else {
                return false;
            };
            let Some((_, width)) = next_unit(&key[star_end..]) else {
                return false;
            };
            backtrack = Some((after_star, star_end + width));
            t = after_star;
            k = star_end + width;
        }
    }
}

/// Parses a class body after `[`. Returns the token and the number of units
/// used including the closing `]`, or `None` if there is no closing `]`.
fn parse_class(units: &[Unit]) -> Option<(Token, usize)> {
    let negated = units.first() == Some(&BANG);
    let body_start = usize::from(negated);
    // A `]` directly after `[` or `[!` is a member, so the search for the
    // closing bracket starts one unit later.
    let search_from = body_start + 1;
    let close = search_from + units.get(search_from..)?.iter().position(|&u| u == CLOSE)?;
    let body = &units[body_start..close];

    let mut items = Vec::new();
    let mut j = 0;
    while j < body.len() {
        if j + 2 < body.len() && body[j + 1] == DASH {
            items.push(ClassItem::Range(body[j], body[j + 2]));
            j += 3;
        } else {
            items.push(ClassItem::Single(body[j]));
            j += 1;
        }
    }
    Some((Token::Class { negated, items }, close + 1))
}

/// Convenience: compile `pattern` and match `key` once.
pub fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    GlobPattern::new(pattern).matches(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(pattern: &str, yes: &[&str], no: &[&str]) {
        let compiled = GlobPattern::new(pattern.as_bytes());
        for key in yes {
            assert!(
                compiled.matches(key.as_bytes()),
                "{pattern:?} should match {key:?}"
            );
        }
        for key in no {
            assert!(
                !compiled.matches(key.as_bytes()),
                "{pattern:?} should not match {key:?}"
            );
        }
    }

    #[test]
    fn star_matches_any_sequence_including_empty_and_slash() {
        check("*", &["", "a", "a/b/c", "*"], &[]);
        check("key*", &["key", "key1", "key/x/y"], &["ke", "xkey1"]);
        check("*/*", &["a/b", "/", "a/b/c"], &["ab"]);
        check("a*b*c", &["abc", "aXbYc", "abbbc", "acbc"], &["acb", "ab"]);
        check("a**b", &["ab", "a/x/b"], &["a"]);
    }

    #[test]
    fn question_mark_matches_exactly_one() {
        check("key?", &["key1", "key/", "key?", "keyé"], &["key", "key12"]);
        check("??", &["ab", "éé"], &["a", "abc"]);
    }

    #[test]
    fn classes_and_ranges() {
        check("[abc]", &["a", "b", "c"], &["d", "", "ab", "A"]);
        check(
            "key[0-9]",
            &["key0", "key5", "key9"],
            &["keya", "key", "key10"],
        );
        check("[a-cx-z]", &["a", "b", "y"], &["d", "w"]);
        check("[a-]", &["a", "-"], &["b"]);
        check("[-a]", &["a", "-"], &["b"]);
        check("[z-a]", &[], &["a", "m", "z"]);
    }

    #[test]
    fn bang_negates() {
        check("[!abc]", &["d", "/", "é"], &["a", "c", ""]);
        check("key[!0-9]", &["keyx"], &["key1"]);
    }

    #[test]
    fn caret_is_a_literal_member() {
        check("[^a]", &["^", "a"], &["b"]);
        check("[!^]", &["a"], &["^"]);
    }

    #[test]
    fn brackets_escape_metacharacters() {
        check("[*]", &["*"], &["a", ""]);
        check("a[?]", &["a?"], &["ab"]);
        check("[[]x", &["[x"], &["x"]);
        check("[]]", &["]"], &["a"]);
        check("[!]]", &["a"], &["]"]);
        check("[]a]", &["]", "a"], &["b"]);
    }

    #[test]
    fn unclosed_bracket_is_literal() {
        check("a[b", &["a[b"], &["ab"]);
        check("[", &["["], &[""]);
        check("[!", &["[!"], &["a"]);
        check("[]", &["[]"], &[]);
        check("[!]", &["[!]"], &["a"]);
    }

    #[test]
    fn anchored_and_case_sensitive() {
        check("abc", &["abc"], &["xabc", "abcx", "ABC", "Abc"]);
        check("a?c", &["abc"], &["ABC"]);
        check("[a-z]", &["q"], &["Q"]);
        check("", &[""], &["a"]);
    }

    #[test]
    fn backslash_is_not_an_escape() {
        check("a\\*", &["a\\", "a\\xyz"], &["a*"]);
    }

    #[test]
    fn binary_keys_match_byte_by_byte() {
        let pattern = GlobPattern::new(b"\x00?\xff*");
        assert!(pattern.matches(b"\x00\x01\xff"));
        assert!(pattern.matches(b"\x00\xfe\xff\x00\r\n"));
        assert!(!pattern.matches(b"\x00\xff"));
        // An invalid UTF-8 byte is one unit for `?`.
        assert!(glob_match(b"a?b", b"a\xe9b"));
        assert!(glob_match(b"[\xe9]", b"\xe9"));
        assert!(!glob_match(b"[\xe9]", "é".as_bytes()));
        // A truncated multi-byte sequence is two raw units.
        assert!(glob_match(b"??", b"\xc3\x28"));
    }

    #[test]
    fn pathological_pattern_stays_fast() {
        // Exponential in a naive recursive matcher; quadratic here.
        let pattern = GlobPattern::new("a*".repeat(30).as_bytes());
        let key = vec![b'a'; 29];
        assert!(!GlobPattern::new(format!("{}b", "a*".repeat(30)).as_bytes()).matches(&key));
        assert!(!pattern.matches(&key));
        assert!(pattern.matches(&[b'a'; 30]));
    }

    #[test]
    fn agrees_with_glob_crate_on_fixed_cases() {
        let patterns = [
            "*", "key*", "?", "[abc]", "[a-z]*", "[!a]", "[^a]", "[*]", "[]]", "[!]]", "a?c",
            "*b*", "[a-]", "é?",
        ];
        let keys = [
            "", "a", "b", "^", "*", "]", "abc", "key1", "-", "é", "éx", "zzz",
        ];
        for p in patterns {
            let reference = glob::Pattern::new(p).unwrap();
            for k in keys {
                assert_eq!(
                    glob_match(p.as_bytes(), k.as_bytes()),
                    reference.matches(k),
                    "{p:?} vs {k:?}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn agrees_with_glob_crate(
            // `**` means something else to the glob crate (see module docs).
            pattern in "[ab/*?\\[\\]!^\\-é]{0,8}".prop_map(|mut p| {
                while p.contains("**") {
                    p = p.replace("**", "*");
                }
                p
            }),
            key in "[ab/!^\\-\\]\\[é*?]{0,8}",
        ) {
            if let Ok(reference) = glob::Pattern::new(&pattern) {
                prop_assert_eq!(
                    glob_match(pattern.as_bytes(), key.as_bytes()),
                    reference.matches(&key),
                    "pattern {:?} key {:?}", pattern, key
                );
            }
        }

        #[test]
        fn literal_patterns_match_only_themselves(
            key in proptest::collection::vec(any::<u8>(), 0..16)
                .prop_map(|k| k.into_iter().map(|b| if b"*?[".contains(&b) { b'x' } else { b }).collect::<Vec<u8>>()),
            other in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            prop_assert!(glob_match(&key, &key));
            prop_assert_eq!(glob_match(&key, &other), key == other);
        }

        #[test]
        fn star_matches_everything(key in proptest::collection::vec(any::<u8>(), 0..32)) {
            prop_assert!(glob_match(b"*", &key));
        }
    }
}
