//! Request checks that depend only on the request and the clock.
//!
//! Invariant: a request that fails here changes nothing. The server calls
//! [`validate`] before proposing (to answer bad requests without a log
//! round trip), and `apply` calls it again with the entry's `now_ms`, so a
//! replica never depends on the proposer having checked.

use mqkv_protocol::{Command, ErrorKind, MAX_CLOCK_SKEW_MS};

use crate::Request;

/// Checks, in the order of wire-compat 5.3: SET without `__ts`, `__ts` too
/// far ahead, `__ft` too far ahead. "Too far" is more than 60 s past
/// `now_ms`; timestamps in the past are fine.
///
/// `__ft` is only judged on SET, DEL and VDEL, the commands it applies to;
/// GET and KEYNOTIFY ignore it. (`malformed timestamp` is decided while
/// parsing the user properties, see `Hlc::from_property`.)
pub fn validate(request: &Request, now_ms: u64) -> Result<(), ErrorKind> {
    let limit = now_ms.saturating_add(MAX_CLOCK_SKEW_MS);
    if matches!(request.command, Command::Set { .. }) && request.ts.is_none() {
        return Err(ErrorKind::MissingTimestamp);
    }
    if request.ts.as_ref().is_some_and(|ts| ts.wall_ms > limit) {
        return Err(ErrorKind::TimestampSkew);
    }
    if request.command.is_write() && request.ft.as_ref().is_some_and(|ft| ft.wall_ms > limit) {
        return Err(ErrorKind::FencingTokenSkew);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mqkv_protocol::Hlc;

    fn set() -> Command {
        Command::Set {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            condition: None,
            px_ms: None,
        }
    }

    fn get() -> Command {
        Command::Get {
            key: Bytes::from_static(b"k"),
        }
    }

    fn req(command: Command, ts: Option<u64>, ft: Option<u64>) -> Request {
        Request {
            ts: ts.map(|ms| Hlc::new(ms, 0, "c")),
            ft: ft.map(|ms| Hlc::new(ms, 0, "c")),
            ..Request::new(command)
        }
    }

    #[test]
    fn set_needs_a_timestamp_but_others_do_not() {
        assert_eq!(
            validate(&req(set(), None, None), 1_000),
            Err(ErrorKind::MissingTimestamp)
        );
        assert_eq!(validate(&req(get(), None, None), 1_000), Ok(()));
        let del = Command::Del {
            key: Bytes::from_static(b"k"),
        };
        assert_eq!(validate(&req(del, None, None), 1_000), Ok(()));
    }

    #[test]
    fn timestamp_skew_boundary_is_sixty_seconds() {
        let now = 1_000_000;
        assert_eq!(validate(&req(set(), Some(now + 60_000), None), now), Ok(()));
        assert_eq!(
            validate(&req(set(), Some(now + 60_001), None), now),
            Err(ErrorKind::TimestampSkew)
        );
        assert_eq!(
            validate(&req(get(), Some(now + 60_001), None), now),
            Err(ErrorKind::TimestampSkew)
        );
        // The past is always fine, including the epoch.
        assert_eq!(validate(&req(set(), Some(0), Some(0)), now), Ok(()));
    }

    #[test]
    fn fencing_token_skew_applies_to_writes_only() {
        let now = 5_000;
        assert_eq!(
            validate(&req(set(), Some(now), Some(now + 60_001)), now),
            Err(ErrorKind::FencingTokenSkew)
        );
        assert_eq!(
            validate(&req(set(), Some(now), Some(now + 60_000)), now),
            Ok(())
        );
        assert_eq!(
            validate(&req(get(), Some(now), Some(now + 600_000)), now),
            Ok(())
        );
    }

    #[test]
    fn checks_run_in_documented_order() {
        let now = 5_000;
        // Missing __ts beats a skewed __ft.
        assert_eq!(
            validate(&req(set(), None, Some(u64::MAX)), now),
            Err(ErrorKind::MissingTimestamp)
        );
        // A skewed __ts beats a skewed __ft.
        assert_eq!(
            validate(&req(set(), Some(u64::MAX), Some(u64::MAX)), now),
            Err(ErrorKind::TimestampSkew)
        );
    }

    #[test]
    fn no_overflow_near_the_end_of_time() {
        assert_eq!(
            validate(&req(set(), Some(u64::MAX), None), u64::MAX),
            Ok(())
        );
    }
}
