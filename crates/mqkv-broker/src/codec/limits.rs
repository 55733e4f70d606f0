//! What can be encoded: every string and binary field of a packet at most 65,535 bytes (its
//! length is two bytes on the wire), every variable byte integer at most 268,435,455, and the
//! packet after its fixed header at most 268,435,455 bytes.
//!
//! Invariant: the encoder writes a packet whole or not at all. [`Packet::encode`] and
//! [`PublishRef::encode`] check a packet first; one that breaks a limit is dropped, counted
//! ([`unencodable`]) and logged. Callers that can do better than dropping (leave out an
//! optional property, refuse a request) check before they build the packet.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Packet, PerReceiver, Properties, PublishRef, V5};

/// The longest string or binary field.
pub const MAX_FIELD: usize = u16::MAX as usize;
/// The largest variable byte integer, and the longest packet after its fixed header.
pub const MAX_VARINT: usize = 268_435_455;

/// Why a packet cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("a field of {0} bytes (at most 65,535)")]
    FieldTooLong(usize),
    #[error("{0} bytes after the fixed header (at most 268,435,455)")]
    PacketTooLong(usize),
    #[error("a variable byte integer of {0} (at most 268,435,455)")]
    NumberTooLarge(usize),
}

static UNENCODABLE: AtomicU64 = AtomicU64::new(0);

/// How many packets were dropped because they could not be encoded.
pub fn unencodable() -> u64 {
    UNENCODABLE.load(Ordering::Relaxed)
}

/// Counts and logs a packet dropped for `why`.
pub(crate) fn dropped(kind: &str, why: EncodeError) {
    UNENCODABLE.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(packet = kind, error = %why, "a packet that cannot be encoded was dropped");
}

pub(crate) fn field(len: usize) -> Result<(), EncodeError> {
    if len > MAX_FIELD {
        return Err(EncodeError::FieldTooLong(len));
    }
    Ok(())
}

fn remaining(len: usize) -> Result<(), EncodeError> {
    if len > MAX_VARINT {
        return Err(EncodeError::PacketTooLong(len));
    }
    Ok(())
}

impl Properties {
    /// Whether every field fits, with `over` in place of the block's per-receiver values.
    pub fn check_with(&self, over: &PerReceiver<'_>) -> Result<(), EncodeError> {
        self.check_fields_with(over)?;
        remaining(self.body_len_with(over))
    }

    /// [`Self::check_with`] without the block's total length, for a caller that measures it.
    fn check_fields_with(&self, over: &PerReceiver<'_>) -> Result<(), EncodeError> {
        let rare = self.rare.as_deref();
        let strings = [
            self.content_type.as_deref(),
            self.response_topic.as_deref(),
            rare.and_then(|r| r.assigned_client_identifier.as_deref()),
            rare.and_then(|r| r.authentication_method.as_deref()),
            rare.and_then(|r| r.response_information.as_deref()),
            rare.and_then(|r| r.server_reference.as_deref()),
            rare.and_then(|r| r.reason_string.as_deref()),
        ];
        for s in strings.into_iter().flatten() {
            field(s.len())?;
        }
        for b in [
            self.correlation_data.as_ref(),
            rare.and_then(|r| r.authentication_data.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            field(b.len())?;
        }
        for (k, v) in &self.user_properties {
            field(k.len())?;
            field(v.len())?;
        }
        for id in over.subscription_identifiers {
            if *id as usize > MAX_VARINT {
                return Err(EncodeError::NumberTooLarge(*id as usize));
            }
        }
        Ok(())
    }

    /// [`Self::check_with`] with the block's own per-receiver values.
    pub fn check(&self) -> Result<(), EncodeError> {
        self.check_with(&self.per_receiver())
    }
}

impl PublishRef<'_> {
    /// Whether this PUBLISH can be encoded at `level`.
    pub fn check(&self, level: u8) -> Result<(), EncodeError> {
        self.checked_properties_body(level).map(drop)
    }

    /// [`Self::check`], giving the property block's length (where the level has one), measured
    /// once for the check and the encoding both.
    pub(crate) fn checked_properties_body(&self, level: u8) -> Result<Option<usize>, EncodeError> {
        field(self.topic.len())?;
        if level == V5 {
            self.properties.check_fields_with(&self.per_receiver)?;
        }
        let body = self.properties_body(level);
        if let Some(body) = body {
            remaining(body)?;
        }
        remaining(self.remaining(body))?;
        Ok(body)
    }
}

impl Packet {
    /// Whether this packet can be encoded at `level`.
    pub fn check(&self, level: u8) -> Result<(), EncodeError> {
        let v5 = level == V5;
        let props = |p: &Properties| if v5 { p.check() } else { Ok(()) };
        match self {
            Packet::Publish(p) => PublishRef::new(p).check(level),
            Packet::Connect(c) => {
                let v5 = c.protocol_level == V5;
                if v5 {
                    c.properties.check()?;
                }
                field(c.client_id.len())?;
                if let Some(w) = &c.will {
                    if v5 {
                        w.properties.check()?;
                    }
                    field(w.topic.len())?;
                    field(w.payload.len())?;
                }
                field(c.username.as_ref().map_or(0, String::len))?;
                field(c.password.as_ref().map_or(0, |p| p.len()))
            }
            Packet::ConnAck(c) => props(&c.properties),
            Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
                props(&a.properties)
            }
            Packet::Subscribe(s) => {
                props(&s.properties)?;
                s.filters.iter().try_for_each(|(f, _)| field(f.len()))
            }
            Packet::Unsubscribe(u) => {
                props(&u.properties)?;
                u.filters.iter().try_for_each(|f| field(f.len()))
            }
            Packet::SubAck(s) => props(&s.properties),
            Packet::UnsubAck(u) => props(&u.properties),
            Packet::Disconnect(d) => props(&d.properties),
            Packet::Auth(a) => props(&a.properties),
            Packet::PingReq | Packet::PingResp => Ok(()),
        }
    }

    /// The packet's name, for logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, Disconnect, PropStr, Publish, QoS, V311};
    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;

    fn publish(topic_len: usize, user_len: usize, payload_len: usize) -> Publish {
        let mut properties = Properties::default();
        if user_len > 0 {
            properties.user_properties = vec![(
                PropStr::Owned("k".repeat(user_len)),
                PropStr::Owned("v".into()),
            )];
        }
        Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: "t".repeat(topic_len),
            packet_id: 7,
            properties,
            payload: Bytes::from(vec![b'p'; payload_len]),
        }
    }

    /// Lengths around the two-byte limit, and some anywhere below and above it.
    fn length() -> impl Strategy<Value = usize> {
        prop_oneof![
            MAX_FIELD - 3..MAX_FIELD + 3,
            0usize..200,
            0usize..2 * MAX_FIELD,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// A PUBLISH is encoded whole, and decodes to itself, or not at all.
        #[test]
        fn a_publish_is_encoded_whole_or_not_at_all(
            topic in length(),
            user in length(),
            payload in 0usize..1_000,
            v5 in any::<bool>(),
        ) {
            let topic = topic.max(1);
            let p = Packet::Publish(publish(topic, user, payload));
            let level = if v5 { V5 } else { V311 };
            let fits = p.check(level).is_ok();
            prop_assert_eq!(fits, topic <= MAX_FIELD && (!v5 || user <= MAX_FIELD));
            let before = unencodable();
            let mut out = BytesMut::new();
            p.encode(&mut out, level);
            if !fits {
                prop_assert!(out.is_empty(), "{} bytes written of a packet that does not fit", out.len());
                prop_assert!(unencodable() > before);
                return Ok(());
            }
            let got = decode(&mut out, Some(level), usize::MAX)
                .expect("decodes")
                .expect("whole");
            prop_assert!(out.is_empty(), "bytes left over");
            let (Packet::Publish(got), Packet::Publish(sent)) = (got, p) else {
                panic!("not a PUBLISH");
            };
            prop_assert_eq!(&got.topic, &sent.topic);
            prop_assert_eq!(&got.payload, &sent.payload);
            if v5 {
                prop_assert_eq!(got.properties.user_properties.len(), usize::from(user > 0));
            }
        }

        /// A DISCONNECT whose reason string is too long is not written.
        #[test]
        fn a_reason_string_too_long_is_not_written(len in length()) {
            let mut d = Disconnect { reason_code: 0x80, properties: Properties::default() };
            d.properties.rare_mut().reason_string = Some("r".repeat(len));
            let p = Packet::Disconnect(d);
            let mut out = BytesMut::new();
            p.encode(&mut out, V5);
            if len > MAX_FIELD {
                prop_assert!(out.is_empty());
            } else {
                let got = decode(&mut out, Some(V5), usize::MAX).expect("decodes").expect("whole");
                prop_assert_eq!(got, p);
            }
        }
    }
}
