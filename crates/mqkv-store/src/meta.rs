//! The cluster table: records the server keeps beside the keys and replicates
//! with them (which node owns a client id, a persistent session's
//! subscriptions, retained messages).
//!
//! Invariants:
//! - opaque to the store: keys and values are bytes, with no versions,
//!   deadlines, quotas or change events; clients of the state store can
//!   neither see nor change them;
//! - a record is its own allocation, never a slice of the entry that carried
//!   it;
//! - a snapshot holds the table whole, in key order.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::snapshot::BytesRef;

/// One change to the cluster table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaChange {
    pub key: Bytes,
    /// The new record, or `None` to remove it.
    pub value: Option<Bytes>,
}

impl MetaChange {
    pub fn put(key: impl Into<Bytes>, value: impl Into<Bytes>) -> MetaChange {
        MetaChange {
            key: key.into(),
            value: Some(value.into()),
        }
    }

    pub fn delete(key: impl Into<Bytes>) -> MetaChange {
        MetaChange {
            key: key.into(),
            value: None,
        }
    }
}

/// The records, by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MetaTable(BTreeMap<Bytes, Bytes>);

impl MetaTable {
    pub(crate) fn apply(&mut self, changes: &[MetaChange]) {
        for change in changes {
            match &change.value {
                Some(value) => {
                    self.0.insert(
                        Bytes::copy_from_slice(&change.key),
                        Bytes::copy_from_slice(value),
                    );
                }
                None => {
                    self.0.remove(&change.key[..]);
                }
            }
        }
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&Bytes> {
        self.0.get(key)
    }

    /// Records whose key starts with `prefix`, in key order.
    pub(crate) fn prefixed<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Bytes, &'a Bytes)> + 'a {
        self.0
            .range::<[u8], _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(key, _)| key.starts_with(prefix))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Bytes of keys and records.
    pub(crate) fn bytes(&self) -> u64 {
        self.0.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
    }
}

impl Serialize for MetaTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Pairs, as the keys are: bytes cannot be map keys in every format.
        serializer.collect_seq(self.0.iter().map(|(k, v)| (BytesRef(k), BytesRef(v))))
    }
}

impl<'de> Deserialize<'de> for MetaTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let pairs = Vec::<(Bytes, Bytes)>::deserialize(deserializer)?;
        Ok(MetaTable(pairs.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_replace_and_deletes_remove() {
        let mut t = MetaTable::default();
        t.apply(&[
            MetaChange::put(&b"o/a"[..], &b"1"[..]),
            MetaChange::put(&b"o/b"[..], &b"2"[..]),
            MetaChange::put(&b"r/x"[..], &b"3"[..]),
            MetaChange::put(&b"o/a"[..], &b"4"[..]),
        ]);
        assert_eq!(t.get(b"o/a").map(|v| &v[..]), Some(&b"4"[..]));
        let owners: Vec<_> = t.prefixed(b"o/").map(|(k, _)| k.clone()).collect();
        assert_eq!(owners, vec![Bytes::from("o/a"), Bytes::from("o/b")]);
        t.apply(&[
            MetaChange::delete(&b"o/a"[..]),
            MetaChange::delete(&b"zz"[..]),
        ]);
        assert_eq!(t.get(b"o/a"), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.bytes(), 3 + 1 + 3 + 1);
    }

    #[test]
    fn a_record_does_not_hold_the_entry_it_came_in() {
        let entry = Bytes::from(vec![7u8; 4096]);
        let mut t = MetaTable::default();
        t.apply(&[MetaChange::put(entry.slice(0..3), entry.slice(3..10))]);
        let stored = t.get(&[7, 7, 7]).expect("stored");
        assert!(!entry.as_ptr_range().contains(&stored.as_ptr()));
    }

    #[test]
    fn round_trips_through_postcard_and_json() {
        let mut t = MetaTable::default();
        t.apply(&[
            MetaChange::put(&b"\x00bin"[..], &b"\xffv"[..]),
            MetaChange::put(&b"s/c"[..], &b""[..]),
        ]);
        let bytes = postcard::to_allocvec(&t).expect("encode");
        assert_eq!(
            postcard::from_bytes::<MetaTable>(&bytes).expect("decode"),
            t
        );
        let json = serde_json::to_string(&t).expect("json");
        assert_eq!(serde_json::from_str::<MetaTable>(&json).expect("json"), t);
    }
}
