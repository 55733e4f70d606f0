//! MQTT 5 user property names and values of the RPC layer the SDKs share.
//!
//! Invariant: names are spelled exactly as the SDKs read and write them;
//! they are case-sensitive on the wire.

/// HLC of the request (client clock), or the key version in responses and
/// notifications.
pub const TIMESTAMP: &str = "__ts";
/// Fencing token HLC on SET/DEL/VDEL.
pub const FENCING_TOKEN: &str = "__ft";
/// RPC status code of a response; always `200` for state store results.
pub const STATUS: &str = "__stat";
/// RPC protocol version (`<major>.<minor>`).
pub const PROTOCOL_VERSION: &str = "__protVer";
/// MQTT client id of the invoker; the KEYNOTIFY observer identity.
pub const SOURCE_ID: &str = "__srcId";
/// Legacy invoker id sent by old .NET clients; fallback for [`SOURCE_ID`].
pub const INVOKER_ID: &str = "__invId";
/// Space-separated major versions the server supports (status 505 only).
pub const SUPPORTED_MAJOR_VERSIONS: &str = "__supProtMajVer";
/// The version the refused request asked for (status 505 only).
pub const REQUEST_PROTOCOL_VERSION: &str = "__requestProtVer";
/// Human-readable status message (non-200 only).
pub const STATUS_MESSAGE: &str = "__stMsg";
/// SET asks for the key to be persisted; only ever sent as `true`.
pub const PERSISTENCE: &str = "aio-persistence";

/// The content type of every request, response and notification.
pub const CONTENT_TYPE: &str = "application/octet-stream";
/// The protocol version the server sends.
pub const PROTOCOL_VERSION_VALUE: &str = "1.0";
/// [`SUPPORTED_MAJOR_VERSIONS`] value.
pub const SUPPORTED_MAJOR_VERSIONS_VALUE: &str = "1";
/// [`STATUS`] for every state store answer, including `-ERR` payloads: the
/// SDKs only map `-ERR` texts to typed errors under status 200.
pub const STATUS_OK: &str = "200";
/// [`STATUS`] for a request whose `__protVer` major is not supported.
pub const STATUS_VERSION_NOT_SUPPORTED: &str = "505";

/// True if a present `__protVer` value is `<int>.<int>` with major 1 (any
/// minor, leading zeros allowed). A missing property means 1.0 and is the
/// caller's case to handle; the empty string is not a version.
pub fn protocol_version_supported(version: &str) -> bool {
    let Some((major, minor)) = version.split_once('.') else {
        return false;
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    all_digits(major) && all_digits(minor) && major.trim_start_matches('0') == "1"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_exact() {
        assert_eq!(TIMESTAMP, "__ts");
        assert_eq!(FENCING_TOKEN, "__ft");
        assert_eq!(STATUS, "__stat");
        assert_eq!(PROTOCOL_VERSION, "__protVer");
        assert_eq!(SOURCE_ID, "__srcId");
        assert_eq!(INVOKER_ID, "__invId");
        assert_eq!(SUPPORTED_MAJOR_VERSIONS, "__supProtMajVer");
        assert_eq!(REQUEST_PROTOCOL_VERSION, "__requestProtVer");
        assert_eq!(STATUS_MESSAGE, "__stMsg");
    }

    #[test]
    fn major_one_with_any_minor_is_supported() {
        for v in ["1.0", "1.1", "1.99", "01.0", "1.00007", "0001.5"] {
            assert!(protocol_version_supported(v), "{v}");
        }
    }

    #[test]
    fn other_versions_are_not() {
        for v in [
            "", "1", "2.0", "0.1", "10.0", "11.0", "1.", ".0", "1.0.0", "+1.0", "-1.0", "1.-0",
            " 1.0", "1.0 ", "one.zero", "1,0", "0.0",
        ] {
            assert!(!protocol_version_supported(v), "{v}");
        }
    }
}
