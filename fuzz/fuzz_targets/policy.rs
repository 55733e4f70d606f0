//! The policy parser: any text is either refused with a reason or read into rules whose
//! grants can be worked out for any client.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_broker::access::{Grants, Principal};
use mqkv_server::policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Policy::parse(text) {
        Ok(policy) => {
            let mut principal = Principal::user("alice");
            principal.set_attribute("city", "seattle");
            for client_id in ["c", "a/b", "*", "+"] {
                let g = policy.client_grants(client_id, &principal);
                let _ = g.may_connect();
                let _ = g.may_publish("a/b");
                let _ = g.subscription(None, "a/#");
                let _ = g.subscription(Some("g"), "+");
                let _ = g.may_receive("a/b");
                let _ = g.may_use(b"k:c", true);
                let _ = g.may_use(b"k:c", false);
            }
        }
        Err(reason) => assert!(!reason.is_empty()),
    }
});
