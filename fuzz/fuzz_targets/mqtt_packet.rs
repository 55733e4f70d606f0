//! The MQTT packet decoder: any bytes, at any protocol level, either decode or fail with a
//! reason code; whatever decodes re-encodes to bytes that decode to the same packet.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mqkv_broker::codec::{self, Packet};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let level = match selector % 3 {
        0 => None,
        1 => Some(codec::V311),
        _ => Some(codec::V5),
    };
    let mut buf = BytesMut::from(rest);
    loop {
        match codec::decode(&mut buf, level, 1 << 20) {
            Ok(Some(packet)) => {
                let enc_level = match (&packet, level) {
                    (Packet::Connect(c), _) => c.protocol_level,
                    (_, Some(l)) => l,
                    (_, None) => unreachable!("only CONNECT decodes before CONNECT"),
                };
                let mut out = BytesMut::new();
                packet.encode(&mut out, enc_level);
                let again = codec::decode(&mut out, level, usize::MAX)
                    .expect("re-encoded packet decodes")
                    .expect("re-encoded packet is whole");
                assert_eq!(again, packet);
            }
            Ok(None) => break,
            Err(e) => {
                let _ = e.reason_code();
                break;
            }
        }
    }
});
