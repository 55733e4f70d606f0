//! Fencing tokens (`__ft`) on SET, DEL and VDEL (wire-compat 5.5).
//!
//! Invariant: once a key holds a token `F`, no write to it succeeds without
//! a token `>= F`, and the stored token never decreases while the key
//! exists. Deleting or expiring the key discards the token.

use mqkv_protocol::{ErrorKind, Hlc};

/// May a write carrying `request` touch a key protected by `stored`?
/// Unprotected keys accept anything, with or without a token.
pub(crate) fn check(stored: Option<&Hlc>, request: Option<&Hlc>) -> Result<(), ErrorKind> {
    match (stored, request) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(ErrorKind::MissingFencingToken),
        (Some(stored), Some(request)) if request < stored => {
            Err(ErrorKind::FencingTokenLowerVersion)
        }
        (Some(_), Some(_)) => Ok(()),
    }
}

/// The token a successful SET leaves on the key: `max(F, __ft)`, or the
/// request's token on an unprotected key, or none.
pub(crate) fn after_set(stored: Option<&Hlc>, request: Option<&Hlc>) -> Option<Hlc> {
    match (stored, request) {
        (Some(stored), Some(request)) => Some(stored.max(request).clone()),
        (Some(token), None) | (None, Some(token)) => Some(token.clone()),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(ms: u64, c: u64, n: &str) -> Hlc {
        Hlc::new(ms, c, n)
    }

    #[test]
    fn unprotected_keys_accept_anything() {
        assert_eq!(check(None, None), Ok(()));
        assert_eq!(check(None, Some(&h(0, 0, ""))), Ok(()));
    }

    #[test]
    fn protected_keys_need_an_equal_or_higher_token() {
        let f = h(100, 2, "srv");
        assert_eq!(check(Some(&f), None), Err(ErrorKind::MissingFencingToken));
        assert_eq!(
            check(Some(&f), Some(&h(100, 1, "srv"))),
            Err(ErrorKind::FencingTokenLowerVersion)
        );
        assert_eq!(
            check(Some(&f), Some(&h(0, 0, "x"))),
            Err(ErrorKind::FencingTokenLowerVersion)
        );
        // Same (ms, counter), lower node id bytes: lower in the total order.
        assert_eq!(
            check(Some(&f), Some(&h(100, 2, "Srv"))),
            Err(ErrorKind::FencingTokenLowerVersion)
        );
        assert_eq!(check(Some(&f), Some(&f)), Ok(()));
        assert_eq!(check(Some(&f), Some(&h(100, 3, "a"))), Ok(()));
        assert_eq!(check(Some(&f), Some(&h(101, 0, "a"))), Ok(()));
    }

    #[test]
    fn set_keeps_the_higher_token() {
        let low = h(1, 0, "a");
        let high = h(2, 0, "a");
        assert_eq!(after_set(Some(&high), Some(&low)), Some(high.clone()));
        assert_eq!(after_set(Some(&low), Some(&high)), Some(high.clone()));
        assert_eq!(after_set(None, Some(&low)), Some(low.clone()));
        assert_eq!(after_set(Some(&low), None), Some(low));
        assert_eq!(after_set(None, None), None);
    }
}
