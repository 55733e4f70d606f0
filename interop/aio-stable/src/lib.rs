//! Test-only crate: the tests live in `../common/tests/` (shared with `aio-beta`).
