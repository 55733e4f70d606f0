//! The raft log's segment decoder: any bytes either replay or are refused
//! with an error, never a panic; what replays keeps a prefix of the bytes,
//! and that prefix, replayed again, is kept whole (cutting off an
//! interrupted write at startup is idempotent).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // Half the inputs get a valid header, so the frames behind it are reached,
    // in the current format or the previous one (payloads not masked).
    let mut bytes = Vec::with_capacity(rest.len() + 16);
    if selector & 1 == 1 {
        let format: u64 = if selector & 4 == 4 {
            1
        } else {
            mqkv_raft::LOG_FORMAT
        };
        bytes.extend_from_slice(b"MQKVLOG\n");
        bytes.extend_from_slice(&format.to_le_bytes());
    }
    bytes.extend_from_slice(rest);
    let newest = selector & 2 == 2;
    if let Ok(valid) = mqkv_raft::replay_segment(&bytes, newest) {
        let valid = usize::try_from(valid).expect("a length");
        assert!(valid <= bytes.len());
        let again =
            mqkv_raft::replay_segment(&bytes[..valid], newest).expect("the kept prefix replays");
        assert_eq!(usize::try_from(again).expect("a length"), valid);
    }
});
