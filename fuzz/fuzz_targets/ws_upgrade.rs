//! The WebSocket upgrade request parser: any bytes, whole or arriving in pieces, give the same
//! answer, and an accepted head is within what was received.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_broker::transport::ws::{parse_request, UpgradeError};

fn summary(
    r: &Result<Option<(usize, mqkv_broker::transport::ws::Upgrade)>, UpgradeError>,
) -> String {
    format!("{r:?}")
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, head)) = data.split_first() else {
        return;
    };
    let whole = parse_request(head, "/mqtt");
    if let Ok(Some((n, upgrade))) = &whole {
        assert!(*n <= head.len());
        assert!(!upgrade.key.is_empty());
    }
    // The first part alone is either still incomplete or already decided the same way.
    let cut = usize::from(cut).min(head.len());
    let first = parse_request(&head[..cut], "/mqtt");
    match &first {
        Ok(None) => {}
        Ok(Some(_)) => assert_eq!(summary(&whole), summary(&first)),
        Err(UpgradeError::Malformed) => assert!(matches!(whole, Err(UpgradeError::Malformed))),
        Err(_) => assert!(whole.is_err()),
    }
});
