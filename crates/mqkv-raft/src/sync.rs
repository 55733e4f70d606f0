//! Lock helpers.
//!
//! A panic while a lock is held leaves the data as it was at the panic:
//! every structure here stays consistent between statements that change it,
//! and the store reports the failure elsewhere, so a poisoned lock is used
//! as is rather than turned into a second panic.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
