//! A page of live records for an operator to look at (the dashboard's keys view): each key
//! with its value, version, fencing token and deadline, in byte order.
//!
//! Like SCAN, a page looks at a bounded number of keys, so one request never walks an
//! unbounded keyspace; unlike SCAN, it carries the records, read at one moment.

use std::ops::Bound;

use bytes::Bytes;
use mqkv_protocol::{GlobPattern, Hlc};

use crate::StateMachine;

/// A page looks at no more than this many keys per record it may return.
const KEYS_EXAMINED_PER_RECORD: usize = 32;

/// One live record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView {
    pub key: Bytes,
    pub value: Bytes,
    pub version: Hlc,
    pub fencing_token: Option<Hlc>,
    /// Unix ms at which the key expires, if it does.
    pub expires_at_ms: Option<u64>,
}

/// A page of records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPage {
    pub records: Vec<RecordView>,
    /// The key to start the next page after; `None` when the walk is over.
    pub next_after: Option<Bytes>,
}

impl StateMachine {
    /// Up to `limit` live records whose keys match `pattern` and `listed` accepts, starting
    /// after the key `after`.
    pub fn browse(
        &self,
        pattern: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        now_ms: u64,
        listed: impl Fn(&[u8]) -> bool,
    ) -> RecordPage {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let glob = GlobPattern::new(pattern);
        let limit = limit.max(1);
        let budget = limit.saturating_mul(KEYS_EXAMINED_PER_RECORD);
        let mut records = Vec::new();
        let mut examined = 0;
        let mut last = None;
        let mut walk = self
            .keys
            .range::<[u8], (Bound<&[u8]>, Bound<&[u8]>)>((start, Bound::Unbounded));
        for (key, record) in walk.by_ref() {
            examined += 1;
            last = Some(key);
            if record.is_live(now_ms) && glob.matches(key) && listed(key) {
                records.push(RecordView {
                    key: Bytes::copy_from_slice(key),
                    value: Bytes::copy_from_slice(&record.value),
                    version: record.version.clone(),
                    fencing_token: record.fencing_token.as_deref().cloned(),
                    expires_at_ms: record.expires_at_ms.map(|d| d.get()),
                });
            }
            if records.len() >= limit || examined >= budget {
                break;
            }
        }
        let next_after = match last {
            Some(last) if walk.next().is_some() => Some(Bytes::copy_from_slice(last)),
            _ => None,
        };
        RecordPage {
            records,
            next_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use bytes::Bytes;

    #[test]
    fn pages_walk_every_matching_live_record_once() {
        let mut m = machine();
        for i in 0..25 {
            put(&mut m, 1_000, &format!("sensor/{i:02}"), "v");
        }
        put(&mut m, 1_000, "other", "v");
        m.apply(&entry(
            1_000,
            set_cmd("sensor/gone", "v", None, Some(10)),
            None,
        ));
        let mut seen = Vec::new();
        let mut after: Option<Bytes> = None;
        let mut pages = 0;
        loop {
            let page = m.browse(b"sensor/*", after.as_deref(), 10, 2_000, |k| {
                k != b"sensor/13"
            });
            pages += 1;
            seen.extend(page.records.iter().map(|r| r.key.clone()));
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let expected: Vec<Bytes> = (0..25)
            .filter(|i| *i != 13)
            .map(|i| Bytes::from(format!("sensor/{i:02}")))
            .collect();
        assert_eq!(seen, expected);
        assert!(pages >= 3, "{pages} pages");
    }

    #[test]
    fn a_record_carries_its_value_version_and_deadline() {
        let mut m = machine();
        let applied = m.apply(&entry(
            1_000,
            set_cmd("k", "hello", None, Some(5_000)),
            None,
        ));
        let page = m.browse(b"*", None, 10, 1_500, |_| true);
        assert_eq!(page.records.len(), 1);
        let r = &page.records[0];
        assert_eq!(&r.value[..], b"hello");
        assert_eq!(Some(r.version.clone()), applied.version);
        assert_eq!(r.expires_at_ms, Some(6_000));
        assert_eq!(page.next_after, None);
    }
}
