//! Broker state as plain data: retained messages and persistent sessions, for saving to disk and
//! loading at start-up.
//!
//! What is kept: every retained message; every session with a non-zero expiry interval, with its
//! subscriptions, queued messages, outgoing QoS 1/2 messages in flight (with their packet ids),
//! incoming QoS 2 packet ids awaiting PUBREL, and a pending delayed will. A message shared by
//! many sessions is stored once. Deadlines (message expiry, will delay, session expiry) are kept
//! as wall-clock times, so downtime counts against them.
//!
//! Sessions that were connected when the state was taken come back as disconnected at load time.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::codec::{Properties, QoS, SubscriptionOptions};
use crate::session::Message;

/// Format version of [`BrokerState`]; bump on any incompatible change.
pub const BROKER_STATE_FORMAT: u32 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerState {
    pub format: u32,
    pub messages: Vec<StoredMessage>,
    /// Indexes into `messages`.
    pub retained: Vec<u32>,
    pub sessions: Vec<StoredSession>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub topic: String,
    /// Shared with the live message when saving (postcard writes it as `Vec<u8>` would be).
    pub payload: Bytes,
    pub qos: u8,
    pub retain: bool,
    /// MQTT 5 property block as on the wire (length prefix included).
    pub properties: Vec<u8>,
    pub expires_at_ms: Option<u64>,
    pub publisher: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDelivery {
    pub message: u32,
    pub qos: u8,
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSubscription {
    pub filter: String,
    pub qos: u8,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: u8,
    pub identifier: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSession {
    pub client_id: String,
    pub expiry_interval: u32,
    pub disconnected_at_ms: Option<u64>,
    pub subscriptions: Vec<StoredSubscription>,
    pub queue: Vec<StoredDelivery>,
    /// Packet id and the delivery awaiting PUBACK/PUBREC, or `None` when released (PUBREL sent).
    pub inflight: Vec<(u16, Option<StoredDelivery>)>,
    pub incoming_qos2: Vec<u16>,
    pub next_packet_id: u16,
    pub pending_will: Option<(u32, u64)>,
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    #[error("broker state format {0} is not supported (expected {BROKER_STATE_FORMAT})")]
    Format(u32),
    #[error("broker state is corrupt: bad {0}")]
    Corrupt(&'static str),
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl StoredMessage {
    /// `m` as data, its expiry as a wall-clock time.
    pub fn of(m: &Message) -> StoredMessage {
        let now = Instant::now();
        StoredMessage {
            topic: m.topic.clone(),
            payload: m.payload.clone(),
            qos: m.qos as u8,
            retain: m.retain,
            properties: m.properties.to_block(),
            expires_at_ms: m.expires_at.map(|t| {
                let left =
                    u64::try_from(t.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
                unix_ms_now().saturating_add(left)
            }),
            publisher: m.publisher.as_deref().map(str::to_owned),
        }
    }

    /// The message again; `None` if it does not decode or has expired.
    pub fn to_message(&self) -> Option<Message> {
        let remaining = match self.expires_at_ms {
            None => None,
            Some(at) => {
                let left = at.checked_sub(unix_ms_now()).filter(|ms| *ms > 0)?;
                Some(Instant::now() + Duration::from_millis(left))
            }
        };
        Some(Message {
            topic: self.topic.clone(),
            payload: self.payload.clone(),
            qos: QoS::from_u8(self.qos)?,
            retain: self.retain,
            properties: Properties::from_block(self.properties.clone()).ok()?,
            expires_at: remaining,
            publisher: self.publisher.as_deref().map(Arc::from),
        })
    }
}

impl StoredSubscription {
    pub(crate) fn of(filter: &str, options: &SubscriptionOptions, identifier: Option<u32>) -> Self {
        StoredSubscription {
            filter: filter.to_owned(),
            qos: options.qos as u8,
            no_local: options.no_local,
            retain_as_published: options.retain_as_published,
            retain_handling: options.retain_handling,
            identifier,
        }
    }

    pub(crate) fn options(&self) -> Option<SubscriptionOptions> {
        Some(SubscriptionOptions {
            qos: QoS::from_u8(self.qos)?,
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            retain_handling: self.retain_handling,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::PropStr;

    #[test]
    fn a_stored_message_keeps_its_expiry_as_a_wall_clock_time() {
        let m = Message {
            topic: "a/b".into(),
            payload: Bytes::from_static(b"x"),
            qos: QoS::ExactlyOnce,
            retain: true,
            properties: Properties {
                content_type: Some(PropStr::Owned("t".into())),
                ..Default::default()
            },
            expires_at: Some(Instant::now() + Duration::from_secs(60)),
            publisher: None,
        };
        let stored = StoredMessage::of(&m);
        let at = stored.expires_at_ms.expect("expiry kept");
        assert!(at > unix_ms_now() + 55_000 && at <= unix_ms_now() + 60_000);
        let back = stored.to_message().expect("decodes");
        assert_eq!(back.qos, QoS::ExactlyOnce);
        assert_eq!(back.payload, m.payload);
        let mut expired = stored.clone();
        expired.expires_at_ms = Some(unix_ms_now() - 1);
        assert!(expired.to_message().is_none());
        let mut broken = stored;
        broken.qos = 7;
        assert!(broken.to_message().is_none());
    }
}
