//! The MQTT packet encoder: packets with fields of any length, at and beyond the protocol's
//! limits, are either encoded whole (and decode to themselves) or not written at all.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use mqkv_broker::codec::{self, Disconnect, Packet, PropStr, Properties, Publish, QoS};

/// A length from three input bytes, up to a little over twice the two-byte limit.
fn length(bytes: &mut impl Iterator<Item = u8>) -> usize {
    let mut n = 0usize;
    for _ in 0..3 {
        n = (n << 8) | usize::from(bytes.next().unwrap_or(0));
    }
    n % 140_000
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.iter().copied();
    let selector = bytes.next().unwrap_or(0);
    let level = if selector & 1 == 1 {
        codec::V5
    } else {
        codec::V311
    };
    let mut properties = Properties::default();
    let user = length(&mut bytes);
    if user > 0 {
        properties.user_properties =
            vec![(PropStr::Owned("k".repeat(user)), PropStr::Owned("v".into()))];
    }
    let reason = length(&mut bytes);
    let packet = if selector & 2 == 2 {
        if reason > 0 {
            properties.rare_mut().reason_string = Some("r".repeat(reason));
        }
        Packet::Disconnect(Disconnect {
            reason_code: 0x80,
            properties,
        })
    } else {
        let topic = length(&mut bytes).max(1);
        let payload = length(&mut bytes) % 4096;
        if reason > 0 {
            properties.content_type = Some(PropStr::Owned("c".repeat(reason)));
        }
        let qos = QoS::from_u8((selector >> 2) % 3).unwrap_or(QoS::AtMostOnce);
        Packet::Publish(Publish {
            dup: false,
            qos,
            retain: selector & 32 == 32,
            topic: "t".repeat(topic),
            // Only QoS 1 and 2 carry one, and it is never 0.
            packet_id: if qos == QoS::AtMostOnce { 0 } else { 9 },
            properties,
            payload: Bytes::from(vec![b'p'; payload]),
        })
    };
    let fits = packet.check(level).is_ok();
    let mut out = BytesMut::new();
    packet.encode(&mut out, level);
    if !fits {
        assert!(
            out.is_empty(),
            "part of a packet that does not fit was written"
        );
        return;
    }
    let again = codec::decode(&mut out, Some(level), usize::MAX)
        .expect("an encoded packet decodes")
        .expect("an encoded packet is whole");
    assert!(out.is_empty(), "bytes after the packet");
    if level == codec::V5 {
        assert_eq!(again, packet);
    } else {
        match (again, packet) {
            (Packet::Publish(a), Packet::Publish(b)) => {
                assert_eq!((a.topic, a.payload), (b.topic, b.payload));
            }
            (Packet::Disconnect(_), Packet::Disconnect(_)) => {}
            (a, b) => panic!("{a:?} decoded from {b:?}"),
        }
    }
});
