//! The state machine: whatever snapshot decodes, with whatever log entries decode after it,
//! applies without a panic (a panic in apply would stop the log, and stop it again on every
//! replay of the same entry); afterwards its snapshot decodes to a machine whose own snapshot
//! is the same bytes (a restart keeps what was applied) and whose derived indexes agree.
//!
//! Input: a 2-byte length, that many bytes of snapshot (an empty one starts from a new
//! machine), then entries back to back in the log's encoding.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_store::{Entry, StateMachine, StoreConfig};

/// Entries applied at most per input, so one input stays fast.
const MOST_ENTRIES: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (snapshot, mut entries) = rest.split_at(len);
    let mut machine = if snapshot.is_empty() {
        StateMachine::new(StoreConfig::new("srv"))
    } else {
        match postcard::from_bytes::<StateMachine>(snapshot) {
            Ok(machine) => machine,
            Err(_) => return,
        }
    };
    for _ in 0..MOST_ENTRIES {
        let Ok((entry, tail)) = postcard::take_from_bytes::<Entry>(entries) else {
            break;
        };
        // As raft's state machine does before applying a proposal.
        machine.prefetch(std::slice::from_ref(&entry));
        machine.apply(&entry);
        entries = tail;
    }
    let bytes = postcard::to_allocvec(&machine).expect("a machine encodes");
    let again: StateMachine = postcard::from_bytes(&bytes).expect("its snapshot decodes");
    assert_eq!(
        postcard::to_allocvec(&again).expect("the restored machine encodes"),
        bytes,
        "a restored machine's snapshot differs from the one it was restored from"
    );
    assert_eq!(again.len(), machine.len());
    assert_eq!(again.stored_bytes(), machine.stored_bytes());
    assert_eq!(again.dedup_len(), machine.dedup_len());
});
