//! The WebSocket upgrade request parser: any bytes, whole or arriving in pieces, give the same
//! answer, and an accepted head is within what was received. The forwarding headers of an
//! accepted head name a client, or are refused, without a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_broker::transport::ws::{parse_request, UpgradeError};
use mqkv_broker::transport::forwarded::{Forwarded, ForwardingHeader};

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
        let peer = "10.0.0.2:40000".parse().expect("an address");
        for header in [ForwardingHeader::XForwardedFor, ForwardingHeader::Forwarded] {
            let any = Forwarded::new::<&str>(header, &[]).expect("settings");
            let _ = any.client(peer, &upgrade.forwarded, &upgrade.x_forwarded_for);
            let listed = Forwarded::new(header, &["10.0.0.0/8"]).expect("settings");
            let _ = listed.client(peer, &upgrade.forwarded, &upgrade.x_forwarded_for);
        }
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
