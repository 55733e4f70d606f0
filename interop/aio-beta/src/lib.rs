//! Test-only crate: shared tests live in `../common/tests/`, beta-only ones in `tests/`.
