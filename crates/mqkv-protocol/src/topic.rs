//! Topics of the state store and the hex encoding used inside them.
//!
//! Invariant: every hex string this module produces is upper case. The Rust
//! SDK subscribes to the literal upper-case client id and decodes the key
//! segment with an upper-case-only decoder that panics otherwise, so a single
//! lower-case digit silently kills that client's notification task.

/// The topic every request is published to.
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// Every notification topic starts with this; requests whose response topic
/// does too must be refused so clients cannot forge notifications.
pub const NOTIFY_TOPIC_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/";

const NOTIFY_INFIX: &str = "/command/notify/";
const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// A string that is not valid hexadecimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    /// Hex encodes whole bytes, so the length must be even.
    #[error("hex string has an odd length")]
    OddLength,
    /// A character outside `0-9a-fA-F`.
    #[error("invalid hex digit at offset {0}")]
    InvalidDigit(usize),
}

/// Upper-case hexadecimal of `bytes`, no separators (RFC 4648 base16).
pub fn hex_upper(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
        out.push(char::from(HEX_DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Decodes hexadecimal in either case. Lenient on case because Go and .NET
/// decoders are, and a decoder gains nothing by being stricter than the peers.
pub fn hex_decode(text: &str) -> Result<Vec<u8>, HexError> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return Err(HexError::OddLength);
    }
    let mut out = Vec::with_capacity(digits.len() / 2);
    for (pair_index, pair) in digits.chunks_exact(2).enumerate() {
        let high = nibble(pair[0]).ok_or(HexError::InvalidDigit(pair_index * 2))?;
        let low = nibble(pair[1]).ok_or(HexError::InvalidDigit(pair_index * 2 + 1))?;
        out.push((high << 4) | low);
    }
    Ok(out)
}

fn nibble(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// The topic on which `client_id` is told about changes to `key`:
/// `NOTIFY_TOPIC_PREFIX + HEX(client_id) + "/command/notify/" + HEX(key)`.
pub fn notification_topic(client_id: &[u8], key: &[u8]) -> String {
    let mut topic = notification_base(client_id, key.len() * 2);
    topic.push_str(&hex_upper(key));
    topic
}

/// The longest topic MQTT can carry, in bytes.
pub const MAX_TOPIC_LEN: usize = 65_535;

/// The length of [`notification_topic`] for a client id and a key of these lengths.
pub fn notification_topic_len(client_id_len: usize, key_len: usize) -> usize {
    NOTIFY_TOPIC_PREFIX.len() + 2 * client_id_len + NOTIFY_INFIX.len() + 2 * key_len
}

/// Whether changes to `key` can be notified to `client_id`: whether the notification topic fits
/// in an MQTT topic. With the SDKs' 36-character client ids the longest such key is 32,694
/// bytes.
pub fn observable(client_id: &[u8], key: &[u8]) -> bool {
    notification_topic_len(client_id.len(), key.len()) <= MAX_TOPIC_LEN
}

/// The filter a client subscribes to for all its notifications
/// (`.../<HEX(client_id)>/command/notify/+`).
pub fn notification_filter(client_id: &[u8]) -> String {
    let mut filter = notification_base(client_id, 1);
    filter.push('+');
    filter
}

fn notification_base(client_id: &[u8], extra: usize) -> String {
    let mut topic = String::with_capacity(
        NOTIFY_TOPIC_PREFIX.len() + client_id.len() * 2 + NOTIFY_INFIX.len() + extra,
    );
    topic.push_str(NOTIFY_TOPIC_PREFIX);
    topic.push_str(&hex_upper(client_id));
    topic.push_str(NOTIFY_INFIX);
    topic
}

/// Splits a notification topic back into `(client_id, key)` bytes, or `None`
/// if it is not one. Used on the client side to route incoming notifications.
pub fn parse_notification_topic(topic: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let rest = topic.strip_prefix(NOTIFY_TOPIC_PREFIX)?;
    let (client_hex, key_hex) = rest.split_once(NOTIFY_INFIX)?;
    if client_hex.contains('/') || key_hex.contains('/') {
        return None;
    }
    Some((hex_decode(client_hex).ok()?, hex_decode(key_hex).ok()?))
}

/// True if a response topic lies inside the namespace reserved for the
/// server: answering there would let a client forge requests or notifications.
pub fn is_reserved_response_topic(topic: &str) -> bool {
    topic == REQUEST_TOPIC || topic.starts_with(NOTIFY_TOPIC_PREFIX.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn article_example_topic() {
        assert_eq!(
            notification_topic(b"client-id1", b"SOMEKEY"),
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
        );
    }

    #[test]
    fn filter_ends_in_single_level_wildcard() {
        assert_eq!(
            notification_filter(b"client-id1"),
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/+"
        );
    }

    #[test]
    fn a_key_is_observable_while_its_topic_fits() {
        let client = "0f8e6d4c-2b1a-4f3e-9d8c-7b6a5f4e3d2c".as_bytes();
        let longest = (0..70_000)
            .rev()
            .find(|n| observable(client, &vec![b'k'; *n]))
            .expect("some key fits");
        assert_eq!(longest, 32_694);
        let topic = notification_topic(client, &vec![b'k'; longest]);
        assert!(topic.len() <= MAX_TOPIC_LEN && topic.len() > MAX_TOPIC_LEN - 2);
        assert_eq!(topic.len(), notification_topic_len(client.len(), longest));
        assert!(!observable(client, &vec![b'k'; longest + 1]));
    }

    #[test]
    fn notification_topic_has_eight_levels() {
        // .NET rejects any other level count.
        let topic = notification_topic(b"c", b"k/with/slashes");
        assert_eq!(topic.split('/').count(), 8);
    }

    #[test]
    fn hex_is_upper_case() {
        assert_eq!(hex_upper(&[0x00, 0xab, 0xff, 0x10]), "00ABFF10");
        assert_eq!(hex_upper(b""), "");
    }

    #[test]
    fn hex_decode_accepts_both_cases_and_rejects_garbage() {
        assert_eq!(
            hex_decode("00abFF10").unwrap(),
            vec![0x00, 0xab, 0xff, 0x10]
        );
        assert_eq!(hex_decode(""), Ok(vec![]));
        assert_eq!(hex_decode("ABC"), Err(HexError::OddLength));
        assert_eq!(hex_decode("0G"), Err(HexError::InvalidDigit(1)));
        assert_eq!(hex_decode("zz"), Err(HexError::InvalidDigit(0)));
    }

    #[test]
    fn parse_notification_topic_inverts_notification_topic() {
        let topic = notification_topic(b"client-id1", b"\x00key\xff");
        assert_eq!(
            parse_notification_topic(&topic),
            Some((b"client-id1".to_vec(), b"\x00key\xff".to_vec()))
        );
        assert_eq!(parse_notification_topic(REQUEST_TOPIC), None);
        assert_eq!(
            parse_notification_topic(&format!("{NOTIFY_TOPIC_PREFIX}41/command/notify/4")),
            None
        );
        assert_eq!(
            parse_notification_topic(&format!("{NOTIFY_TOPIC_PREFIX}41/x/command/notify/42")),
            None
        );
    }

    #[test]
    fn reserved_response_topics() {
        assert!(is_reserved_response_topic(REQUEST_TOPIC));
        assert!(is_reserved_response_topic(
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8"
        ));
        assert!(is_reserved_response_topic(&notification_topic(b"a", b"b")));
        assert!(!is_reserved_response_topic(
            "clients/me/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
        ));
    }

    proptest! {
        #[test]
        fn hex_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let hex = hex_upper(&bytes);
            prop_assert_eq!(hex.len(), bytes.len() * 2);
            prop_assert!(!hex.bytes().any(|b| b.is_ascii_lowercase()));
            prop_assert_eq!(hex_decode(&hex).unwrap(), bytes.clone());
            prop_assert_eq!(hex_decode(&hex.to_ascii_lowercase()).unwrap(), bytes);
        }
    }
}
