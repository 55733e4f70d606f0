//! What goes into the log ([`Entry`]) and what comes out of applying it
//! ([`Applied`]).
//!
//! Invariant: an entry carries every input `apply` needs — the proposer's
//! wall clock, the request's HLCs, the de-duplication identity — so applying
//! it reads no clock and no randomness and every replica computes the same
//! outcome.

use std::sync::Arc;

use bytes::Bytes;
use mqkv_protocol::{Command, ErrorKind, Hlc, Notification, Response};
use serde::{Deserialize, Serialize};

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The proposer's wall clock in Unix milliseconds.
    pub now_ms: u64,
    /// What to do.
    pub op: Op,
}

/// The operation of an entry.
// An entry is built once per request and then moved or serialized; boxing
// the request would add an allocation per request to save stack space on
// the rare `ExpireDue`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// A client request.
    Request(Request),
    /// Delete every key whose deadline is at or before `now_ms`. Proposed by
    /// the leader's expiry timer (see `StateMachine::next_expiry_ms`).
    ExpireDue,
    /// Change the limits. A log entry like any other, so entries before it
    /// are replayed under the old limits and entries after it under the new
    /// ones, on every replica. The node id never changes (versions keep it).
    SetLimits(Limits),
    /// Change records of the cluster table (see `meta`), in order.
    Meta(Vec<crate::MetaChange>),
    /// Change how much of the change history is kept (see `history`). Through the log, as
    /// `SetLimits`, so that every replica keeps the same history.
    SetHistory(crate::HistoryLimits),
}

/// The adjustable part of a [`crate::StoreConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_keys: Option<u64>,
    pub max_bytes: Option<u64>,
    pub scan_page_size: usize,
}

/// A client request with the user properties that matter to the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The parsed payload. SET, DEL and VDEL change state; GET and SCAN are
    /// answered as reads; KEYNOTIFY is node-local and is refused here.
    pub command: Command,
    /// `__ts`, already parsed (a malformed one is refused before proposing).
    pub ts: Option<Hlc>,
    /// `__ft`, already parsed.
    pub ft: Option<Hlc>,
    /// Identity for answering QoS 1 redeliveries with the first answer.
    pub dedup: Option<DedupId>,
}

impl Request {
    /// A request with no timestamps and no de-duplication identity.
    pub fn new(command: Command) -> Self {
        Request {
            command,
            ts: None,
            ft: None,
            dedup: None,
        }
    }
}

/// Identity of one request for de-duplication: the same client id and
/// correlation data within the request's message expiry is the same request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupId {
    /// Invoker identity (`__srcId`, or the connection's client id), shared
    /// with the connection rather than copied for every request. Encoded as
    /// a string.
    pub client_id: Arc<str>,
    /// MQTT correlation data, compared as opaque bytes.
    pub correlation: Bytes,
    /// When the request's message expiry runs out (Unix ms); no redelivery
    /// can arrive after it, so the remembered answer can be dropped.
    pub expires_at_ms: u64,
}

/// The outcome of applying one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The payload to answer with.
    pub response: Response,
    /// The `__ts` to put on the response (wire-compat 3.1): the new version
    /// for an applied SET, the stored version for a SET not applied and for
    /// a GET hit, the deletion's version for a DEL/VDEL that deleted, and
    /// `None` everywhere else (a GET miss must carry no `__ts`).
    pub version: Option<Hlc>,
    /// Changes to notify observers about, in order. Publish them before the
    /// response. They can be present even with an error response: a key
    /// found past its deadline is removed (and reported deleted) before the
    /// request itself is judged.
    pub events: Vec<ChangeEvent>,
    /// True for a SET that created its key (it was absent or past its deadline): what the
    /// server counts as an insertion rather than a modification.
    pub created: bool,
}

impl Applied {
    pub(crate) fn reply(response: Response, version: Option<Hlc>) -> Self {
        Applied {
            response,
            version,
            events: Vec::new(),
            created: false,
        }
    }

    pub(crate) fn error(kind: ErrorKind) -> Self {
        Applied::reply(Response::Error(kind), None)
    }
}

/// One change of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeEvent {
    /// The key that changed.
    pub key: Bytes,
    /// What happened to it.
    pub kind: ChangeKind,
    /// The notification's `__ts`: the new version for a SET (the same value
    /// the SET response carries), a fresh version for a deletion.
    pub version: Hlc,
}

/// Kind of change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    /// The key now holds `value`.
    Set { value: Bytes },
    /// The key was deleted by DEL, VDEL or expiry.
    Delete,
}

impl ChangeEvent {
    /// The notification payload for this change.
    pub fn notification(&self) -> Notification {
        match &self.kind {
            ChangeKind::Set { value } => Notification::Set {
                value: value.clone(),
            },
            ChangeKind::Delete => Notification::Delete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_notifications() {
        let set = ChangeEvent {
            key: Bytes::from_static(b"k"),
            kind: ChangeKind::Set {
                value: Bytes::from_static(b"abc"),
            },
            version: Hlc::new(1, 0, "n"),
        };
        assert_eq!(
            &set.notification().encode()[..],
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"
        );
        let delete = ChangeEvent {
            kind: ChangeKind::Delete,
            ..set
        };
        assert_eq!(delete.notification(), Notification::Delete);
    }

    /// The identity as logs and snapshots of earlier versions hold it, with
    /// the client id as an owned string.
    #[derive(Serialize, Deserialize)]
    struct OwnedDedupId {
        client_id: String,
        correlation: Bytes,
        expires_at_ms: u64,
    }

    #[test]
    fn dedup_id_encodes_as_with_an_owned_client_id() {
        let shared = DedupId {
            client_id: Arc::from("client-\u{e9}"),
            correlation: Bytes::from_static(b"\x00\x01corr"),
            expires_at_ms: 1_700_000_000_123,
        };
        let owned = OwnedDedupId {
            client_id: "client-\u{e9}".to_owned(),
            correlation: Bytes::from_static(b"\x00\x01corr"),
            expires_at_ms: 1_700_000_000_123,
        };
        let written = postcard::to_allocvec(&owned).expect("encode");
        assert_eq!(postcard::to_allocvec(&shared).expect("encode"), written);
        let read: DedupId = postcard::from_bytes(&written).expect("decode");
        assert_eq!(read, shared);
    }
}
