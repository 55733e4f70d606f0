#!/usr/bin/env bash
# The project's test command: installs what the tests need, then runs every suite.
#   bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi

# Debian packages: the mosquitto command-line clients are real peers in the interop tests;
# Mosquitto and Redis are the benchmark's side-by-side anchors, and etcd its cluster anchor
# (its smoke tests run them); openssl makes the TLS certificates of the SDK interop tests;
# Chromium and its driver run the dashboard's browser tests; HAProxy and nginx stand in front
# of listeners behind a proxy.
missing=()
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v mosquitto_rr >/dev/null 2>&1 || missing+=(mosquitto-clients)
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ "${#missing[@]}" -gt 0 ]; then
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

# Python packages: paho-mqtt, pytest, cryptography for the tests' certificates, Selenium for
# the browser tests.
python3 -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt

# Build everything first: the Python and SDK suites start the freshly built server.
cargo build --workspace --all-targets

# Python interop suite against the freshly built server.
MQKV_BIN="$PWD/target/debug/mqkv" python3 -m pytest tests/python -q

# The official Azure IoT Operations Rust SDK (stable and beta) against the server.
MQKV_BIN="$PWD/target/debug/mqkv" bash scripts/interop-aio.sh

# Rust: unit, property and integration tests (the integration tests start real servers).
# Last, so that the run closes with the largest suite's summary.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi

