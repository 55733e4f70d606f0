//! `SCAN pattern [token]`: list keys matching a glob, a page at a time.
//!
//! Invariants:
//! - keys come in byte order, each at most once per walk, and a key past
//!   its deadline is never listed;
//! - a page holds at most `scan_page_size` keys and looks at a bounded
//!   number of keys, so one request never walks an unbounded keyspace;
//!   pages may therefore be empty while a token is still returned;
//! - the token is `after:` followed by the last key looked at. It names a
//!   position, not a snapshot, so a walk survives concurrent writes: keys
//!   present for the whole walk are listed exactly once. Anything else
//!   (including a token from another server) is `-ERR syntax error`.

use std::ops::Bound;

use bytes::{BufMut, Bytes, BytesMut};
use mqkv_protocol::{ErrorKind, GlobPattern, Response};

use crate::StateMachine;

/// Prefix of every continuation token.
pub const SCAN_TOKEN_PREFIX: &[u8] = b"after:";

/// A page looks at no more than this many keys per key it may return, so
/// sparse matches cost bounded work per request. With the default page size
/// that is 3,200 keys per request, while 100 matches among a few hundred
/// keys (the SDK tests) still fit in one or two pages.
const KEYS_EXAMINED_PER_PAGE_SLOT: usize = 32;

impl StateMachine {
    /// One page of keys matching `pattern`, starting after `token`.
    pub fn scan(&self, pattern: &[u8], token: Option<&[u8]>, now_ms: u64) -> Response {
        self.scan_where(pattern, token, now_ms, |_| true)
    }

    /// A SCAN page like [`StateMachine::scan`] that lists only keys `listed` accepts (those
    /// the client may read). Keys it refuses count as looked at, so a page's work stays
    /// bounded and the token goes on past them.
    pub fn scan_where(
        &self,
        pattern: &[u8],
        token: Option<&[u8]>,
        now_ms: u64,
        listed: impl Fn(&[u8]) -> bool,
    ) -> Response {
        if pattern.is_empty() {
            return Response::Error(ErrorKind::KeyLengthZero);
        }
        let start = match token {
            None => Bound::Unbounded,
            Some(token) => match token.strip_prefix(SCAN_TOKEN_PREFIX) {
                // Keys are never empty, so neither is a real position.
                Some(after) if !after.is_empty() => Bound::Excluded(after),
                _ => return Response::Error(ErrorKind::SyntaxError),
            },
        };
        let glob = GlobPattern::new(pattern);
        let page_size = self.config.scan_page_size.max(1);
        let budget = page_size.saturating_mul(KEYS_EXAMINED_PER_PAGE_SLOT);

        let mut keys = Vec::new();
        let mut examined = 0;
        let mut last = None;
        let mut walk = self
            .keys
            .range::<[u8], (Bound<&[u8]>, Bound<&[u8]>)>((start, Bound::Unbounded));
        for (key, record) in walk.by_ref() {
            examined += 1;
            last = Some(key);
            if record.is_live(now_ms) && glob.matches(key) && listed(key) {
                keys.push(Bytes::copy_from_slice(key));
            }
            if keys.len() >= page_size || examined >= budget {
                break;
            }
        }
        let token = match last {
            Some(last) if walk.next().is_some() => Some(continuation_token(last)),
            _ => None,
        };
        Response::ScanPage { keys, token }
    }
}

fn continuation_token(last: &[u8]) -> Bytes {
    let mut token = BytesMut::with_capacity(SCAN_TOKEN_PREFIX.len() + last.len());
    token.put_slice(SCAN_TOKEN_PREFIX);
    token.put_slice(last);
    token.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_support::*;
    use crate::{Applied, StoreConfig};
    use mqkv_protocol::Command;

    fn paged(page: usize) -> StateMachine {
        StateMachine::new(StoreConfig {
            scan_page_size: page,
            ..StoreConfig::new("srv")
        })
    }

    /// Follows tokens to the end; returns all keys and the page count.
    fn walk(m: &StateMachine, pattern: &str, now: u64) -> (Vec<Bytes>, usize) {
        let mut all = Vec::new();
        let mut token: Option<Bytes> = None;
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages < 10_000, "scan does not terminate");
            let Response::ScanPage { keys, token: next } =
                m.scan(pattern.as_bytes(), token.as_deref(), now)
            else {
                panic!("not a page");
            };
            all.extend(keys);
            match next {
                Some(next) => token = Some(next),
                None => return (all, pages),
            }
        }
    }

    #[test]
    fn single_page_when_everything_fits() {
        let mut m = machine();
        for k in ["key2", "key1", "other", "key3"] {
            put(&mut m, 1, k, "v");
        }
        assert_eq!(
            m.scan(b"key*", None, 1),
            Response::ScanPage {
                keys: vec![b("key1"), b("key2"), b("key3")],
                token: None
            }
        );
        assert_eq!(
            m.scan(b"nomatch*", None, 1),
            Response::ScanPage {
                keys: vec![],
                token: None
            }
        );
    }

    #[test]
    fn pages_chain_through_tokens() {
        let mut m = paged(2);
        for i in 0..7 {
            put(&mut m, 1, &format!("k{i}"), "v");
        }
        let first = m.scan(b"*", None, 1);
        let Response::ScanPage { keys, token } = &first else {
            panic!()
        };
        assert_eq!(keys, &vec![b("k0"), b("k1")]);
        assert_eq!(token.as_deref(), Some(&b"after:k1"[..]));
        let (all, pages) = walk(&m, "*", 1);
        assert_eq!(all.len(), 7);
        assert_eq!(pages, 4);
        assert!(all.windows(2).all(|w| w[0] < w[1]), "ordered, no repeats");
    }

    #[test]
    fn sdk_test_shape_fits_in_few_pages() {
        // 100 matching keys among others; the SDK allows at most 64 pages.
        let mut m = machine();
        for i in 0..100 {
            put(&mut m, 1, &format!("scan-{i:03}"), "v");
            put(&mut m, 1, &format!("zzz-{i:03}"), "v");
            put(&mut m, 1, &format!("aaa-{i:03}"), "v");
        }
        let (keys, pages) = walk(&m, "scan-*", 1);
        assert_eq!(keys.len(), 100);
        assert!(pages <= 64, "{pages} pages");
    }

    #[test]
    fn sparse_matches_give_bounded_possibly_empty_pages() {
        let mut m = paged(1);
        for i in 0..100 {
            put(&mut m, 1, &format!("a{i:03}"), "v");
        }
        put(&mut m, 1, "b", "v");
        let Response::ScanPage { keys, token } = m.scan(b"b", None, 1) else {
            panic!()
        };
        assert!(keys.is_empty(), "budget of 32 keys reached before 'b'");
        assert!(token.is_some());
        let (all, _) = walk(&m, "b", 1);
        assert_eq!(all, vec![b("b")]);
    }

    #[test]
    fn expired_keys_are_never_listed() {
        let mut m = machine();
        m.apply(&entry(100, set_cmd("gone", "v", None, Some(10)), None));
        put(&mut m, 100, "kept", "v");
        let (keys, _) = walk(&m, "*", 110);
        assert_eq!(keys, vec![b("kept")]);
        let (keys, _) = walk(&m, "*", 109);
        assert_eq!(keys, vec![b("gone"), b("kept")]);
    }

    #[test]
    fn bad_tokens_are_syntax_errors() {
        let mut m = machine();
        put(&mut m, 1, "k", "v");
        for token in [&b""[..], b"after:", b"off:20", b"\x00\xffx", b"AFTER:k"] {
            assert_eq!(
                m.scan(b"*", Some(token), 1),
                Response::Error(ErrorKind::SyntaxError),
                "{token:?}"
            );
        }
    }

    #[test]
    fn token_for_a_deleted_key_still_works() {
        let mut m = paged(1);
        for k in ["a", "b", "c"] {
            put(&mut m, 1, k, "v");
        }
        let Response::ScanPage { token, .. } = m.scan(b"*", None, 1) else {
            panic!()
        };
        m.apply(&entry(2, Command::Del { key: b("a") }, None));
        let Response::ScanPage { keys, .. } = m.scan(b"*", token.as_deref(), 2) else {
            panic!()
        };
        assert_eq!(keys, vec![b("b")]);
    }

    #[test]
    fn binary_keys_and_tokens() {
        let mut m = paged(1);
        for k in [&b"\x00a"[..], b"\x00b", b"\xff"] {
            m.apply(&entry(
                1,
                Command::Set {
                    key: Bytes::copy_from_slice(k),
                    value: b("v"),
                    condition: None,
                    px_ms: None,
                },
                None,
            ));
        }
        let Response::ScanPage { keys, token } = m.scan(b"\x00?", None, 1) else {
            panic!()
        };
        assert_eq!(keys, vec![Bytes::from_static(b"\x00a")]);
        assert_eq!(token.as_deref(), Some(&b"after:\x00a"[..]));
    }

    #[test]
    fn empty_pattern_is_key_length_zero() {
        assert_eq!(
            machine().scan(b"", None, 1),
            Response::Error(ErrorKind::KeyLengthZero)
        );
    }

    #[test]
    fn scan_through_apply_is_a_read() {
        let mut m = machine();
        put(&mut m, 1, "k", "v");
        let before = m.clone();
        let applied = m.apply(&entry(
            2,
            Command::Scan {
                pattern: b("*"),
                token: None,
            },
            None,
        ));
        assert_eq!(
            applied,
            Applied::reply(
                Response::ScanPage {
                    keys: vec![b("k")],
                    token: None
                },
                None
            )
        );
        assert_eq!(m, before);
    }
}
