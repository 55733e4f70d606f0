use bytes::{BufMut, Bytes, BytesMut};

use super::*;
use proptest::strategy::Strategy as _;

/// A PUBLISH announced at 16,000,000 bytes of which 1 KB has come: the buffer grows with
/// what arrived, doubling, not to what was announced.
#[test]
fn room_for_a_partial_packet_follows_what_arrived() {
    let mut buf = BytesMut::new();
    buf.put_u8(0x30);
    let mut announced = BytesMut::new();
    write_varint(&mut announced, 16_000_000);
    buf.extend_from_slice(&announced);
    buf.extend_from_slice(&[0u8; 1024]);
    assert!(matches!(decode(&mut buf, Some(V5), 1 << 30), Ok(None)));
    assert!(buf.capacity() <= 32 * 1024, "{}", buf.capacity());
    let more = buf.capacity() - buf.len();
    buf.extend_from_slice(&vec![0u8; more]);
    let filled = buf.capacity();
    assert!(matches!(decode(&mut buf, Some(V5), 1 << 30), Ok(None)));
    assert!(
        buf.capacity() <= 4 * filled,
        "{} after {filled}",
        buf.capacity()
    );
}

fn roundtrip(p: Packet, level: u8) -> Packet {
    let mut out = BytesMut::new();
    p.encode(&mut out, level);
    let lvl = if matches!(p, Packet::Connect(_)) {
        None
    } else {
        Some(level)
    };
    let got = decode(&mut out, lvl, usize::MAX)
        .expect("decodes")
        .expect("whole");
    assert!(out.is_empty());
    got
}

#[test]
fn publish_roundtrip_v5_with_properties() {
    let p = Publish {
        qos: QoS::AtLeastOnce,
        topic: "a/b".into(),
        packet_id: 7,
        properties: Properties {
            message_expiry_interval: Some(30),
            correlation_data: Some(Bytes::from_static(b"\x00\x01")),
            user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
            ..Default::default()
        },
        payload: Bytes::from_static(b"hello"),
        ..Default::default()
    };
    assert_eq!(
        roundtrip(Packet::Publish(p.clone()), V5),
        Packet::Publish(p)
    );
}

#[test]
fn common_property_texts_decode_borrowed_and_others_owned() {
    let p = Publish {
        qos: QoS::AtLeastOnce,
        topic: "a/b".into(),
        packet_id: 7,
        properties: Properties {
            content_type: Some("application/octet-stream".into()),
            user_properties: vec![
                ("__protVer".into(), "1.0".into()),
                ("__ts".into(), "0000000000001:00000:n".into()),
                ("__protVe".into(), "1.00".into()),
            ],
            ..Default::default()
        },
        ..Default::default()
    };
    let Packet::Publish(got) = roundtrip(Packet::Publish(p.clone()), V5) else {
        panic!("not a PUBLISH");
    };
    assert_eq!(got, p);
    let borrowed = |s: &PropStr| matches!(s, PropStr::Borrowed(_));
    assert!(got.properties.content_type.as_ref().is_some_and(borrowed));
    let kinds: Vec<(bool, bool)> = got
        .properties
        .user_properties
        .iter()
        .map(|(k, v)| (borrowed(k), borrowed(v)))
        .collect();
    assert_eq!(kinds, [(true, true), (true, false), (false, false)]);
}

#[test]
fn a_common_property_text_is_checked_like_any_other() {
    // User property whose name's length runs past the block: truncated, not borrowed.
    let props = [0x26u8, 0, 9, b'_', b'_', b'p', b'r', b'o', b't'];
    let mut body = vec![0, 1, b't', 0, 1, props.len() as u8];
    body.extend_from_slice(&props);
    let mut b = BytesMut::from(&[0x32u8, body.len() as u8][..]);
    b.extend_from_slice(&body);
    assert_eq!(
        decode(&mut b, Some(V5), 1000),
        Err(DecodeError::Malformed("binary data truncated"))
    );
}

#[test]
fn connect_roundtrip_both_levels() {
    for level in [V311, V5] {
        let c = Connect {
            protocol_level: level,
            clean_start: true,
            keep_alive: 30,
            client_id: "c1".into(),
            username: Some("u".into()),
            password: Some(Bytes::from_static(b"p")),
            will: Some(Will {
                topic: "w".into(),
                payload: Bytes::from_static(b"bye"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: Properties::default(),
            }),
            properties: Properties::default(),
        };
        assert_eq!(
            roundtrip(Packet::Connect(Box::new(c.clone())), level),
            Packet::Connect(Box::new(c))
        );
    }
}

#[test]
fn rare_properties_roundtrip_out_of_line() {
    let mut connack = Properties {
        session_expiry_interval: Some(60),
        receive_maximum: Some(10),
        ..Default::default()
    };
    let rare = connack.rare_mut();
    rare.assigned_client_identifier = Some("auto-1".into());
    rare.authentication_method = Some("SCRAM".into());
    rare.authentication_data = Some(Bytes::from_static(b"\x00\x01"));
    rare.response_information = Some("clients/auto-1".into());
    rare.server_reference = Some("other:1883".into());
    rare.reason_string = Some("because".into());
    let mut out = BytesMut::new();
    connack.encode(&mut out);
    assert_eq!(out.len(), connack.encoded_len());
    let mut bytes = out.freeze();
    let got = Properties::decode(&mut bytes, PropContext::ConnAck).expect("decodes");
    assert_eq!(got, connack);
    assert!(bytes.is_empty());
    // A packet without any of them has none allocated, and a rare property is decoded
    // with the context rules of every other one.
    let ack = Packet::PubAck(Ack {
        packet_id: 3,
        reason_code: 0x10,
        properties: Properties {
            rare: Some(Box::new(RareProperties {
                reason_string: Some("no subscribers".into()),
                ..Default::default()
            })),
            ..Default::default()
        },
    });
    assert_eq!(roundtrip(ack.clone(), V5), ack);
    let plain = Packet::PubAck(Ack {
        packet_id: 3,
        ..Default::default()
    });
    let Packet::PubAck(got) = roundtrip(plain, V5) else {
        panic!("not a PUBACK");
    };
    assert!(got.properties.rare.is_none());
    // Assigned Client Identifier is a CONNACK property only.
    let mut b = BytesMut::from(&[0x40u8, 6, 0, 3, 0, 3, 0x12, 0][..]);
    assert!(decode(&mut b, Some(V5), 1000).is_err());
}

#[test]
fn properties_stay_small_to_move() {
    // Every PUBLISH and acknowledgement moves its properties a few times on the way
    // through the broker.
    assert!(
        std::mem::size_of::<Properties>() <= 200,
        "{} bytes",
        std::mem::size_of::<Properties>()
    );
}

#[test]
fn strings_are_checked_ascii_or_not() {
    fn read(raw: &[u8]) -> Result<String, DecodeError> {
        let mut encoded = BytesMut::new();
        encoded.put_u16(raw.len() as u16);
        encoded.put_slice(raw);
        encoded.put_u8(b'!');
        let mut buf = encoded.freeze();
        let read = read_string(&mut buf);
        if read.is_ok() {
            assert_eq!(&buf[..], b"!", "consumed exactly the string");
        }
        read
    }
    let long_ascii = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
    for ok in [
        "",
        "a",
        long_ascii,
        "caf\u{e9}",
        "\u{1f600}/topic",
        "x/\u{7ff}/\u{ffff}",
    ] {
        assert_eq!(read(ok.as_bytes()).as_deref(), Ok(ok), "{ok:?}");
    }
    let invalid = Err(DecodeError::Malformed("invalid UTF-8 string"));
    let nul = Err(DecodeError::Malformed("string contains U+0000"));
    let mut nul_late = long_ascii.as_bytes().to_vec();
    nul_late.push(0);
    let cases: [(&[u8], _); 8] = [
        (b"\xff", invalid.clone()),
        (b"abc\xc0\x80", invalid.clone()),
        (b"\x80abc", invalid.clone()),
        (b"caf\xc3", invalid.clone()),
        (b"\xed\xa0\x80", invalid.clone()),
        (b"\0", nul.clone()),
        (&nul_late, nul.clone()),
        ("caf\u{e9}\0".as_bytes(), nul.clone()),
    ];
    for (raw, want) in cases {
        assert_eq!(read(raw), want, "{raw:?}");
    }
}

#[test]
fn plain_acks_are_the_packets_bytes_and_decode_back() {
    type Kind = (u8, fn(Ack) -> Packet);
    let kinds: [Kind; 4] = [
        (ack_header::PUBACK, Packet::PubAck),
        (ack_header::PUBREC, Packet::PubRec),
        (ack_header::PUBREL, Packet::PubRel),
        (ack_header::PUBCOMP, Packet::PubComp),
    ];
    for (header, packet) in kinds {
        for level in [V311, V5] {
            for packet_id in [1, 0x1234, u16::MAX] {
                for reason_code in [0, 0x10, reason::PACKET_IDENTIFIER_NOT_FOUND] {
                    let ack = Ack {
                        packet_id,
                        reason_code,
                        ..Default::default()
                    };
                    let mut want = BytesMut::new();
                    packet(ack.clone()).encode(&mut want, level);
                    let mut got = BytesMut::new();
                    encode_plain_ack(&mut got, header, packet_id, reason_code, level);
                    assert_eq!(
                        got, want,
                        "header {header:#x} level {level} id {packet_id} reason {reason_code}"
                    );
                    let decoded = decode(&mut got, Some(level), usize::MAX)
                        .expect("decodes")
                        .expect("whole");
                    let reason_kept = if level == V5 { reason_code } else { 0 };
                    assert_eq!(
                        decoded,
                        packet(Ack {
                            reason_code: reason_kept,
                            ..ack
                        })
                    );
                }
            }
        }
    }
}

#[test]
fn plain_acks_are_taken_as_decode_reads_them() {
    let mut packets = Vec::new();
    for level in [V311, V5] {
        for reason_code in [0, 0x10] {
            for packet_id in [1, 0x1234] {
                let ack = || Ack {
                    packet_id,
                    reason_code,
                    ..Default::default()
                };
                packets.push((level, Packet::PubAck(ack())));
                packets.push((level, Packet::PubRec(ack())));
                packets.push((level, Packet::PubComp(ack())));
                packets.push((level, Packet::PubRel(ack())));
            }
        }
        let with_properties = Ack {
            packet_id: 7,
            reason_code: 0x10,
            properties: Properties {
                user_properties: vec![("k".into(), "v".into())],
                ..Default::default()
            },
        };
        packets.push((level, Packet::PubAck(with_properties)));
        packets.push((level, Packet::PingReq));
    }
    for (level, packet) in packets {
        let mut encoded = BytesMut::new();
        packet.encode(&mut encoded, level);
        encoded.extend_from_slice(b"next");
        let mut taken = encoded.clone();
        let mut decoded = encoded.clone();
        let expected = decode(&mut decoded, Some(level), usize::MAX)
            .expect("decodes")
            .expect("whole");
        match take_plain_ack(&mut taken, level, usize::MAX) {
            Some(plain) => {
                let ack = Ack {
                    packet_id: plain.packet_id,
                    reason_code: plain.reason_code,
                    ..Default::default()
                };
                let as_packet = match plain.header {
                    ack_header::PUBACK => Packet::PubAck(ack),
                    ack_header::PUBREC => Packet::PubRec(ack),
                    ack_header::PUBCOMP => Packet::PubComp(ack),
                    other => panic!("taken a packet with header {other:#x}"),
                };
                assert_eq!(as_packet, expected);
                assert_eq!(taken, decoded, "the same bytes are left");
            }
            None => {
                assert_eq!(taken, encoded, "nothing taken from {expected:?}");
                let plain = matches!(
                    &expected,
                    Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubComp(a)
                        if a.properties == Properties::default()
                );
                assert!(!plain, "a plain ack left behind: {expected:?}");
            }
        }
    }
    // Incomplete, invalid or too large: left for `decode` to judge.
    for (bytes, max) in [
        (&[0x40u8][..], usize::MAX),
        (&[0x40, 2, 0][..], usize::MAX),
        (&[0x40, 2, 0, 0][..], usize::MAX),
        (&[0x41, 2, 0, 1][..], usize::MAX),
        (&[0x40, 3, 0, 1][..], usize::MAX),
        (&[0x40, 2, 0, 1][..], 3),
    ] {
        let mut buf = BytesMut::from(bytes);
        assert_eq!(take_plain_ack(&mut buf, V5, max), None, "{bytes:?}");
        assert_eq!(&buf[..], bytes);
    }
    let mut v311_with_reason = BytesMut::from(&[0x40u8, 3, 0, 1, 0x10][..]);
    assert_eq!(
        take_plain_ack(&mut v311_with_reason, V311, usize::MAX),
        None
    );
}

#[test]
fn partial_packet_consumes_nothing() {
    let mut out = BytesMut::new();
    Packet::PingReq.encode(&mut out, V5);
    let mut half = BytesMut::from(&out[..1]);
    assert_eq!(decode(&mut half, Some(V5), 100), Ok(None));
    assert_eq!(half.len(), 1);
}

#[test]
fn violations_map_to_reason_codes() {
    // QoS 3 publish.
    let mut b = BytesMut::from(&[0x36u8, 3, 0, 1, b'a'][..]);
    assert_eq!(
        decode(&mut b, Some(V5), 1000).unwrap_err().reason_code(),
        0x81
    );
    // Too large.
    let mut b = BytesMut::from(&[0x30u8, 0x7F][..]);
    assert_eq!(
        decode(&mut b, Some(V5), 10).unwrap_err(),
        DecodeError::TooLarge
    );
    // Second CONNECT.
    let mut b = BytesMut::from(&[0x10u8, 0][..]);
    assert_eq!(
        decode(&mut b, Some(V5), 10).unwrap_err().reason_code(),
        0x82
    );
    // Bad PUBREL flags.
    let mut b = BytesMut::from(&[0x60u8, 2, 0, 1][..]);
    assert_eq!(
        decode(&mut b, Some(V5), 10).unwrap_err().reason_code(),
        0x81
    );
    // Duplicate property.
    let mut b = BytesMut::from(&[0x30u8, 8, 0, 1, b'a', 4, 1, 0, 1, 0][..]);
    assert_eq!(
        decode(&mut b, Some(V5), 100).unwrap_err().reason_code(),
        0x82
    );
    // Five-byte remaining length.
    let mut b = BytesMut::from(&[0x30u8, 0xFF, 0xFF, 0xFF, 0xFF, 0x01][..]);
    assert_eq!(
        decode(&mut b, Some(V5), usize::MAX)
            .unwrap_err()
            .reason_code(),
        0x81
    );
}

proptest::proptest! {
    #[test]
    fn decoder_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
                            level in proptest::option::of(proptest::sample::select(vec![V311, V5]))) {
        let mut b = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = decode(&mut b, level, 1 << 20) {}
    }

    /// A string is taken or refused exactly as the general checks (UTF-8, then no U+0000)
    /// decide: texts mostly ASCII, with NULs, multi-byte characters, stray continuation
    /// bytes and other high bytes mixed in, at every alignment.
    #[test]
    fn strings_are_checked_as_utf8_is(
        lead in 0usize..9,
        pieces in proptest::collection::vec(
            proptest::prop_oneof![
                8 => (1u8..0x80).prop_map(|b| vec![b]),
                1 => proptest::strategy::Just(vec![0u8]),
                1 => proptest::char::any().prop_map(|c| c.to_string().into_bytes()),
                1 => (0x80u8..=0xFF).prop_map(|b| vec![b]),
            ],
            0..80,
        ),
    ) {
        let text = pieces.concat();
        let mut framed = vec![b'x'; lead];
        framed.extend_from_slice(&(text.len() as u16).to_be_bytes());
        framed.extend_from_slice(&text);
        framed.push(b'!');
        let mut buf = Bytes::from(framed).slice(lead..);
        let expected = match std::str::from_utf8(&text) {
            Err(_) => Err(DecodeError::Malformed("invalid UTF-8 string")),
            Ok(t) if t.contains('\0') => Err(DecodeError::Malformed("string contains U+0000")),
            Ok(t) => Ok(t.to_owned()),
        };
        let read = read_string(&mut buf);
        if read.is_ok() {
            proptest::prop_assert_eq!(&buf[..], b"!");
        }
        proptest::prop_assert_eq!(read, expected);
    }
}
