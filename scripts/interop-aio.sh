#!/usr/bin/env bash
# Interop tests of mqkv against the official Azure IoT Operations Rust SDK
# (crate azure_iot_operations_services, features state_store + leased_lock):
#   interop/aio-stable  -> 1.3.0        (latest stable)
#   interop/aio-beta    -> 1.5.0-beta1  (newest beta; adds SCAN / list_keys)
# Both crates run the shared tests in interop/common/tests; aio-beta adds tests/scan.rs.
# Every suite runs three times: against a single node, and against the leader and a follower
# of a three-node cluster.
# They are separate crates with their own lock files because cargo cannot hold two
# semver-compatible versions of one crate in a single lock file.
#
#   bash scripts/interop-aio.sh                  # build the server, run both suites
#   bash scripts/interop-aio.sh -- --nocapture   # extra args go to the test binaries
#
# Env: MQKV_BIN (server binary; default: build it and use target/debug/mqkv),
#      CARGO_TARGET_DIR for the interop crates (default: target/interop, shared by both).
# Exits non-zero if anything fails to build or any test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

test_args=()
if [ "${1:-}" = "--" ]; then
  shift
  test_args=("$@")
fi

if [ -z "${MQKV_BIN:-}" ]; then
  echo "== building the server (cargo build -p mqkv)"
  cargo build -p mqkv || { echo "interop-aio: server build failed" >&2; exit 1; }
  export MQKV_BIN="$root/target/debug/mqkv"
fi
case "$MQKV_BIN" in
  /*) ;;
  *) MQKV_BIN="$root/$MQKV_BIN" ;;
esac
export MQKV_BIN
[ -x "$MQKV_BIN" ] || { echo "interop-aio: no server binary at $MQKV_BIN" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/interop}"
# Test a private copy: a concurrent `cargo build` elsewhere may rewrite target/debug/mqkv
# while the suites are starting servers.
mkdir -p "$CARGO_TARGET_DIR"
snapshot="$CARGO_TARGET_DIR/mqkv-under-test"
cp -f "$MQKV_BIN" "$snapshot.tmp" && mv -f "$snapshot.tmp" "$snapshot" \
  || { echo "interop-aio: cannot copy $MQKV_BIN" >&2; exit 1; }
echo "== server under test: $MQKV_BIN (copied to $snapshot)"
export MQKV_BIN="$snapshot"

# Each suite runs against a single node, then against the leader and against a follower of a
# three-node cluster (MQKV_INTEROP_CLUSTER, read by the harness in interop/common/support).
failed=()
for crate in aio-stable aio-beta; do
  manifest="interop/$crate/Cargo.toml"
  for target in "" leader follower; do
    echo "== $crate${target:+ (cluster $target)}: cargo test --tests --manifest-path $manifest"
    # --locked: the committed Cargo.lock files pin the SDK and every transitive dependency.
    if ! MQKV_INTEROP_CLUSTER="$target" cargo test --locked --tests --manifest-path "$manifest" \
      --no-fail-fast -- "${test_args[@]}"; then
      failed+=("$crate${target:+ (cluster $target)}")
    fi
  done
done

if [ "${#failed[@]}" -ne 0 ]; then
  echo "interop-aio: FAILED: ${failed[*]}" >&2
  echo "interop-aio: server logs are in $CARGO_TARGET_DIR/tmp/mqkv-interop-logs/" >&2
  exit 1
fi
echo "interop-aio: all AIO SDK interop suites passed"
