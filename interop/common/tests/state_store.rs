//! mqkv's state store driven by the official AIO Rust SDK `state_store::Client`.
//!
//! Shared by the `aio-stable` (1.3.0) and `aio-beta` (1.5.0-beta1) crates. Each test starts its
//! own server; expected behaviour is the one in shared/spec/aio-wire-compat.md sections 1-6.

#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::state_store::{
    ErrorKind, ServiceError, SetCondition, SetOptions,
};

use support::*;

fn nx() -> SetOptions {
    SetOptions {
        set_condition: SetCondition::OnlyIfDoesNotExist,
        ..Default::default()
    }
}

fn nex() -> SetOptions {
    SetOptions {
        set_condition: SetCondition::OnlyIfEqualOrDoesNotExist,
        ..Default::default()
    }
}

fn px(ms: u64) -> SetOptions {
    SetOptions {
        expires: Some(Duration::from_millis(ms)),
        ..Default::default()
    }
}

#[path = "state_store/concurrency.rs"]
mod concurrency;
#[path = "state_store/conditions.rs"]
mod conditions;
#[path = "state_store/expiry.rs"]
mod expiry;
#[path = "state_store/fencing.rs"]
mod fencing;
#[path = "state_store/notifications.rs"]
mod notifications;
#[path = "state_store/sizes.rs"]
mod sizes;
#[path = "state_store/versions.rs"]
mod versions;
