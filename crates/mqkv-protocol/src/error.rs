//! The twelve `-ERR` messages every official client recognises.
//!
//! Invariant: the text of each variant is byte-for-byte what the SDKs
//! compare against. Go compares with `==` and Rust compares the exact bytes
//! between `-ERR ` and `\r\n`, so a single changed character turns a typed
//! client error into an "unknown" one. Note "lower version **than**": the
//! public article's "that" is a typo no client accepts.

use serde::{Deserialize, Serialize};

/// A state-store-level failure, answered in-band as `-ERR <message>\r\n`
/// with `__stat` 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum ErrorKind {
    /// The request `__ts` is more than the allowed skew ahead of the server clock.
    #[error("the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized")]
    TimestampSkew,
    /// The key is fenced and the request carries no `__ft`.
    #[error("a fencing token is required for this request")]
    MissingFencingToken,
    /// The request `__ft` is more than the allowed skew ahead of the server clock.
    #[error("the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized")]
    FencingTokenSkew,
    /// The request `__ft` is lower than the token stored with the key.
    #[error("the request fencing token is a lower version than the fencing token protecting the resource")]
    FencingTokenLowerVersion,
    /// The key-count or memory quota would be exceeded.
    #[error("the quota has been exceeded")]
    QuotaExceeded,
    /// Malformed RESP3, or bad options.
    #[error("syntax error")]
    SyntaxError,
    /// Denied by an authorization rule.
    #[error("not authorized")]
    NotAuthorized,
    /// The verb is not one the store knows.
    #[error("unknown command")]
    UnknownCommand,
    /// The verb got too few or too many arguments.
    #[error("wrong number of arguments")]
    WrongNumberOfArguments,
    /// A SET arrived without `__ts`.
    #[error("missing timestamp")]
    MissingTimestamp,
    /// `__ts` or `__ft` does not parse as an HLC.
    #[error("malformed timestamp")]
    MalformedTimestamp,
    /// The key (or SCAN pattern) is empty.
    #[error("the key length is zero")]
    KeyLengthZero,
    /// KEYNOTIFY on a key whose notification topic would exceed MQTT's 65,535-byte topic
    /// limit (see [`crate::topic::observable`]). Not in the wire-compat table: the SDKs report
    /// it as an error with this text.
    #[error("the key is too long to be observed")]
    KeyTooLongToObserve,
    /// `KEYNOTIFY key SINCE version` (an extension) for a version older than the change
    /// history the server keeps: the client must read the key again.
    #[error("the changes since that version are no longer kept")]
    HistoryCompacted,
}

impl ErrorKind {
    /// Every variant, in the order of the wire-compat table.
    pub const ALL: [ErrorKind; 14] = [
        ErrorKind::TimestampSkew,
        ErrorKind::MissingFencingToken,
        ErrorKind::FencingTokenSkew,
        ErrorKind::FencingTokenLowerVersion,
        ErrorKind::QuotaExceeded,
        ErrorKind::SyntaxError,
        ErrorKind::NotAuthorized,
        ErrorKind::UnknownCommand,
        ErrorKind::WrongNumberOfArguments,
        ErrorKind::MissingTimestamp,
        ErrorKind::MalformedTimestamp,
        ErrorKind::KeyLengthZero,
        ErrorKind::KeyTooLongToObserve,
        ErrorKind::HistoryCompacted,
    ];

    /// The exact text that follows `-ERR ` on the wire.
    pub fn message(&self) -> &'static str {
        match self {
            ErrorKind::TimestampSkew => "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized",
            ErrorKind::MissingFencingToken => "a fencing token is required for this request",
            ErrorKind::FencingTokenSkew => "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized",
            ErrorKind::FencingTokenLowerVersion => "the request fencing token is a lower version than the fencing token protecting the resource",
            ErrorKind::QuotaExceeded => "the quota has been exceeded",
            ErrorKind::SyntaxError => "syntax error",
            ErrorKind::NotAuthorized => "not authorized",
            ErrorKind::UnknownCommand => "unknown command",
            ErrorKind::WrongNumberOfArguments => "wrong number of arguments",
            ErrorKind::MissingTimestamp => "missing timestamp",
            ErrorKind::MalformedTimestamp => "malformed timestamp",
            ErrorKind::KeyLengthZero => "the key length is zero",
            ErrorKind::KeyTooLongToObserve => "the key is too long to be observed",
            ErrorKind::HistoryCompacted => "the changes since that version are no longer kept",
        }
    }

    /// The variant whose message is exactly `text`, if any.
    pub fn from_message(text: &str) -> Option<ErrorKind> {
        ErrorKind::ALL
            .into_iter()
            .find(|kind| kind.message() == text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_wire_compat_table() {
        let expected = [
            "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized",
            "a fencing token is required for this request",
            "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized",
            "the request fencing token is a lower version than the fencing token protecting the resource",
            "the quota has been exceeded",
            "syntax error",
            "not authorized",
            "unknown command",
            "wrong number of arguments",
            "missing timestamp",
            "malformed timestamp",
            "the key length is zero",
            // mqkv's own, after the table's.
            "the key is too long to be observed",
            "the changes since that version are no longer kept",
        ];
        assert_eq!(expected.len(), ErrorKind::ALL.len());
        for (kind, text) in ErrorKind::ALL.iter().zip(expected) {
            assert_eq!(kind.message(), text);
            assert_eq!(kind.to_string(), text, "Display must equal the wire text");
            assert_eq!(ErrorKind::from_message(text), Some(*kind));
        }
    }

    #[test]
    fn lower_version_uses_than_not_that() {
        let text = ErrorKind::FencingTokenLowerVersion.message();
        assert!(text.contains("lower version than the"));
        assert_eq!(
            ErrorKind::from_message(
                "the request fencing token is a lower version that the fencing token protecting the resource"
            ),
            None
        );
    }

    #[test]
    fn no_message_contains_line_breaks() {
        for kind in ErrorKind::ALL {
            assert!(!kind.message().contains(['\r', '\n']));
        }
    }

    #[test]
    fn unknown_text_is_not_mapped() {
        assert_eq!(ErrorKind::from_message("syntax error "), None);
        assert_eq!(ErrorKind::from_message("Syntax error"), None);
        assert_eq!(ErrorKind::from_message(""), None);
    }
}
