//! Client-side decoders for responses (MGET answers included) and notifications: no panics, and
//! anything accepted re-encodes into a non-empty payload that parses back
//! to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_protocol::{Notification, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok(response) = Response::parse(data) {
        let encoded = response.encode();
        assert!(!encoded.is_empty());
        assert_eq!(Response::parse(&encoded), Ok(response));
    }
    // An MGET answer, as a client that sent MGET reads it.
    if let Ok(values) = Response::parse_values(data) {
        assert_eq!(Response::parse_values(&values.encode()), Ok(values));
    }
    if let Ok(notification) = Notification::parse(data) {
        assert_eq!(
            Notification::parse(&notification.encode()),
            Ok(notification)
        );
    }
});
