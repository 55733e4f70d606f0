"""Fixtures for the mqkv interop suite: a real `mqkv serve` per test.

Every test gets its own server on an ephemeral loopback port (so tests can run in parallel).
At teardown the fixture checks that the server is still running ("server stays up"), stops it
with SIGTERM, and checks that it exited with status 0 and logged no panic.

Run: `cd <repo> && python3 -m pytest tests/python -q` (needs requirements.txt and the Debian
package mosquitto-clients; the server binary comes from $MQKV_BIN, default
target/debug/mqkv). Server logs (RUST_LOG, default "info,openraft=warn,mqkv_broker=debug")
go to a file in the test's tmp_path; a failing test prints their tail.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import MQKV_BIN, MqkvServer, cleanup  # noqa: E402


def pytest_sessionstart(session):
    if not Path(MQKV_BIN).is_file():
        raise pytest.UsageError(
            f"mqkv binary not found at {MQKV_BIN}: run `cargo build -p mqkv` or set MQKV_BIN"
        )


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def mqkv(request, tmp_path):
    """Factory: `mqkv(*flags, config=None)` starts a server and returns it."""
    servers: list[MqkvServer] = []

    def start(*args, config: str | None = None, listeners: int = 0,
              plain: bool = True) -> MqkvServer:
        s = MqkvServer(args, tmp_path, config, listeners, plain)
        servers.append(s)
        return s

    yield start

    cleanup.run()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for s in servers:
            print(f"--- {' '.join(s.cmd)}\n--- log {s.stderr_path} (tail):\n{s.stderr_tail(30)}")
    problems = []
    for s in servers:
        if s.stopped:
            # The test stopped it and checked the outcome itself.
            s.assert_no_panic()
            continue
        if not s.alive():
            problems.append(
                f"server died during the test (exit {s.proc.returncode}):\n{s.stderr_tail()}"
            )
            continue
        rc = s.terminate()
        if rc != 0:
            problems.append(f"server exited {rc} after SIGTERM:\n{s.stderr_tail()}")
        text = s.stderr_text()
        if "panicked" in text:
            problems.append(f"server panicked:\n{s.stderr_tail(60)}")
    assert not problems, "\n\n".join(problems)


@pytest.fixture
def server(mqkv) -> MqkvServer:
    """A server with default settings."""
    return mqkv()


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    cleanup.run()
