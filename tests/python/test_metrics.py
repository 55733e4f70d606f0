"""The HTTP listener: /metrics scraped with the Prometheus text parser before and after known
traffic (each counter moves by exactly what was sent), /healthz, /readyz (ready with a leader,
503 without one), and JSON logs."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from helpers import HOST, MQKV_BIN, Paho
from statestore import StoreClient
from test_cluster import free_port


def fetch(server, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{server.http_port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(server) -> dict:
    """Every sample as {(name, frozenset of labels but hostname): value}."""
    status, text = fetch(server, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k != "hostname")
            assert s.labels.get("hostname"), s
            # The parser names a counter's sample NAME_total; the page says NAME, as AIO's.
            name = family.name if s.name == f"{family.name}_total" else s.name
            assert f"\n{name}{{" in text, name
            out[(name, labels)] = s.value
    return out


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, frozenset(labels.items()))
    return after[key] - before.get(key, 0)


def value(m: dict, name: str, **labels) -> float:
    return m[(name, frozenset(labels.items()))]


def quiet(server):
    """A scrape once the counters have stopped moving."""
    last = None
    for _ in range(50):
        now = scrape(server)
        if now == last:
            return now
        last = now
        time.sleep(0.1)
    return last


def test_pubsub_counters_move_by_exactly_what_was_sent(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    subs = [Paho(server, f"sub-{i}") for i in range(2)]
    for s in subs:
        assert s.subscribe("m/#", 1) == [1]
    pub = Paho(server, "pub")
    before = quiet(server)
    assert value(before, "aio_broker_connected_sessions") == 3
    assert value(before, "aio_broker_total_subscriptions") == 2
    assert value(before, "mqkv_connections", kind="tcp") == 3
    payloads = [b"x" * n for n in (1, 10, 100, 1000, 5, 7, 9)]
    for i, p in enumerate(payloads):
        pub.publish(f"m/{i}", p, qos=1)
    pub.publish("m/kept", b"retained!", qos=1, retain=True)
    for s in subs:
        s.collect(len(payloads) + 1)
    after = quiet(server)
    sent = len(payloads) + 1
    size = sum(map(len, payloads)) + len(b"retained!")
    assert delta(before, after, "aio_broker_publishes_received", category="uncategorized") == sent
    assert delta(before, after, "aio_broker_payload_bytes_received", category="uncategorized") == size
    assert delta(before, after, "aio_broker_publishes_sent", category="uncategorized") == 2 * sent
    assert delta(before, after, "aio_broker_payload_bytes_sent", category="uncategorized") == 2 * size
    assert value(after, "aio_broker_store_retained_messages") == 1
    assert value(after, "aio_broker_store_retained_bytes") == len("m/kept") + len(b"retained!")
    # One more connection: one more authentication.
    Paho(server, "late")
    later = quiet(server)
    assert delta(after, later, "aio_broker_authentication_successes") == 1
    assert value(later, "aio_broker_connected_sessions") == 4


def test_state_store_counters_and_latency(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    c = StoreClient(Paho(server, "store"), "store")
    watcher_mqtt = Paho(server, "watcher")
    watcher = StoreClient(watcher_mqtt, "watcher")
    assert c.set("existing", "v") == b"+OK\r\n"
    assert watcher.request("KEYNOTIFY", "existing") == b"+OK\r\n"
    before = quiet(server)
    for k in ("a", "b", "c"):
        assert c.set(k, "1") == b"+OK\r\n"
    assert c.set("existing", "2") == b"+OK\r\n"
    assert c.request("SET", "existing", "3", "NX") == b":-1\r\n"
    assert c.get("a") == b"$1\r\n1\r\n"
    assert c.get("missing") == b"$-1\r\n"
    assert c.request("DEL", "b") == b":1\r\n"
    assert c.request("VDEL", "c", "1") == b":1\r\n"
    assert c.request("KEYNOTIFY", "a") == b"+OK\r\n"
    assert c.request("SCAN", "*").startswith(b"*")
    watcher_mqtt.get()  # the notification of "existing"
    after = quiet(server)
    d = lambda name, **kw: delta(before, after, name, **kw)  # noqa: E731
    assert d("aio_broker_state_store_insertions") == 3
    assert d("aio_broker_state_store_modifications") == 2
    assert d("aio_broker_state_store_retrievals") == 2
    assert d("aio_broker_state_store_deletions") == 2
    assert d("aio_broker_state_store_keynotify_requests") == 1
    assert d("aio_broker_state_store_notifications_sent") == 1
    assert d("mqkv_state_store_scans") == 1
    # Every request is a PUBLISH received and answered with one.
    assert d("aio_broker_publishes_received", category="uncategorized") == 11
    assert d("aio_broker_publishes_sent", category="uncategorized") == 11 + 1
    for command, n in (("SET", 5), ("GET", 2), ("DEL", 1), ("VDEL", 1), ("KEYNOTIFY", 1),
                       ("SCAN", 1)):
        assert d("mqkv_state_store_request_duration_seconds_count", command=command) == n
        assert d("mqkv_state_store_request_duration_seconds_bucket", command=command,
                 le="+Inf") == n
    assert value(after, "mqkv_state_store_keys") == 2  # a and existing
    assert value(after, "mqkv_raft_is_leader", node="1") == 1
    assert value(after, "mqkv_raft_applied_index", node="1") >= 6
    assert value(after, "mqkv_raft_commit_index", node="1") >= value(
        after, "mqkv_raft_applied_index", node="1")


def test_authorization_and_authentication_counters(mqkv, tmp_path):
    passwords = tmp_path / "passwords"
    subprocess.run([MQKV_BIN, "passwd", str(passwords), "u", "--password-stdin"],
                   input=b"pw\n", check=True, timeout=30)
    policy = tmp_path / "policy.yaml"
    policy.write_text("- principals: { usernames: [u] }\n  brokerResources:\n"
                      "    - method: Connect\n    - method: Publish\n      topics: [ok/#]\n")
    server = mqkv("--http", f"{HOST}:0", "--password-file", passwords, "--policy", policy)
    before = quiet(server)
    c = Paho(server, "c", username="u", password="pw")
    Paho(server, "d", username="u", password="wrong", expect_rc=0x86)
    assert c.publish("ok/1", b"x", qos=1) == 0x10
    assert c.publish("no/1", b"x", qos=1) == 0x87
    after = quiet(server)
    assert delta(before, after, "aio_broker_authentication_successes") == 1
    assert delta(before, after, "aio_broker_authentication_failures") == 1
    assert delta(before, after, "aio_broker_authorization_allow") == 1
    assert delta(before, after, "aio_broker_authorization_deny") == 1


def test_health_and_readiness(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    status, body = fetch(server, "/healthz")
    assert (status, json.loads(body)["status"]) == (200, "ok")
    status, body = fetch(server, "/readyz")
    assert status == 200 and json.loads(body)["status"] == "ready"
    assert fetch(server, "/nothing-here")[0] == 404


def test_a_node_without_a_quorum_is_not_ready(mqkv, tmp_path):
    # One node of three, the others never started: no leader can be elected.
    ports = [free_port() for _ in range(3)]
    peers = [a for i, p in enumerate(ports) for a in ("--peer", f"{i + 1}=127.0.0.1:{p}")]
    node = mqkv("--http", f"{HOST}:0", "--node-id", "1", "--cluster-listen",
                f"127.0.0.1:{ports[0]}", *peers, "--storage", "disk", "--data-dir",
                str(tmp_path / "n1"))
    time.sleep(1.0)
    status, body = fetch(node, "/readyz")
    assert status == 503, body
    assert json.loads(body)["status"] == "not ready"
    assert fetch(node, "/healthz")[0] == 200
    m = scrape(node)
    assert value(m, "mqkv_raft_leader", node="1") == 0


def test_an_explicit_http_address_that_is_taken_stops_the_start(mqkv, tmp_path):
    server = mqkv("--http", f"{HOST}:0")
    res = subprocess.run([MQKV_BIN, "serve", "--listen", f"{HOST}:0", "--storage", "memory",
                          "--http", f"{HOST}:{server.http_port}"],
                         capture_output=True, timeout=30, cwd=tmp_path)
    assert res.returncode != 0
    assert "cannot listen" in res.stderr.decode()


def test_json_logs(tmp_path):
    proc = subprocess.Popen([MQKV_BIN, "serve", "--listen", f"{HOST}:0", "--storage", "memory",
                             "--http", "off", "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("listening on "), line
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    lines = [json.loads(x) for x in err.decode().splitlines() if x.strip()]
    assert lines, "no log lines"
    assert all("level" in x and "fields" in x for x in lines), lines[:3]


def test_durable_log_writes_are_counted_and_timed(mqkv, tmp_path):
    server = mqkv("--http", f"{HOST}:0", "--storage", "disk", "--data-dir", tmp_path / "data")
    c = StoreClient(Paho(server, "store"), "store")
    before = quiet(server)
    for i in range(5):
        assert c.set(f"k{i}", "v") == b"+OK\r\n"
    after = quiet(server)
    d = lambda name, **kw: delta(before, after, name, **kw)  # noqa: E731
    # Each SET waited for its own append here (one client, one request at a time).
    commits = d("mqkv_log_commits")
    assert commits >= 5
    assert d("mqkv_log_write_duration_seconds_count") == commits
    assert d("mqkv_log_write_duration_seconds_bucket", le="+Inf") == commits
    assert d("mqkv_log_write_duration_seconds_sum") > 0
    assert d("mqkv_log_entries_written") >= commits


def test_traffic_per_metric_category_and_dropped_qos0(mqkv):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    server = mqkv("--http", f"{HOST}:0")
    sub = Paho(server, "cat-sub")
    assert sub.subscribe("c/#", 1) == [1]
    props = Properties(PacketTypes.CONNECT)
    props.UserProperty = [("metriccategory", "plant-a")]
    pub = Paho(server, "cat-pub", properties=props)
    # A persistent session whose client is away: QoS 0 messages for it are dropped.
    away_props = Properties(PacketTypes.CONNECT)
    away_props.SessionExpiryInterval = 300
    away = Paho(server, "cat-away", clean_start=False, properties=away_props)
    assert away.subscribe("c/#", 0) == [0]
    away.disconnect()
    before = quiet(server)
    for i in range(3):
        pub.publish(f"c/{i}", b"abcd", qos=1)
    pub.publish("c/q0", b"zero", qos=0)
    sub.collect(4)
    after = quiet(server)
    d = lambda name, **kw: delta(before, after, name, **kw)  # noqa: E731
    assert d("aio_broker_publishes_received", category="plant-a") == 4
    assert d("aio_broker_payload_bytes_received", category="plant-a") == 16
    assert d("aio_broker_publishes_received", category="uncategorized") == 0
    # What the uncategorized subscriber received counts under its own category.
    assert d("aio_broker_publishes_sent", category="uncategorized") == 4
    assert d("aio_broker_publishes_sent", category="plant-a") == 0
    assert d("aio_broker_qos0_messages_dropped", direction="outgoing") == 4


def test_sets_refused_before_the_log_are_counted_too(mqkv, tmp_path):
    passwords = tmp_path / "passwords"
    subprocess.run([MQKV_BIN, "passwd", str(passwords), "u", "--password-stdin"],
                   input=b"pw\n", check=True, timeout=30)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "- principals: { usernames: [u] }\n  brokerResources:\n    - method: Connect\n"
        "    - method: Publish\n      topics: ['statestore/#']\n"
        "    - method: Subscribe\n      topics: ['clients/#']\n"
        "  stateStoreResources:\n    - method: ReadWrite\n      keyType: Pattern\n"
        "      keys: ['mine:*']\n")
    server = mqkv("--http", f"{HOST}:0", "--password-file", passwords, "--policy", policy)
    c = StoreClient(Paho(server, "u-1", username="u", password="pw"), "u-1")
    assert c.set("mine:k", "1") == b"+OK\r\n"
    before = quiet(server)
    assert c.set("theirs", "1") == b"-ERR not authorized\r\n"
    assert c.request("SET", "mine:k", "2", "NX", "NEX") == b"-ERR syntax error\r\n"
    after = quiet(server)
    # The refused SET of a missing key is an insertion; the malformed one never parsed.
    assert delta(before, after, "aio_broker_state_store_insertions") == 1
    assert delta(before, after, "aio_broker_state_store_modifications") == 0


def test_handshake_failures_are_counted_by_reason(mqkv, tmp_path):
    from certs import make_pki
    from helpers import wait_for
    from test_transports import RawWs

    pki = make_pki(tmp_path / "pki")
    server = mqkv("--listen-tls", f"{HOST}:0", "--listen-ws", f"{HOST}:0", "--http", f"{HOST}:0",
                  "--tls-cert", pki.server.cert_path, "--tls-key", pki.server.key_path)
    before = quiet(server)
    for reason in ("tls", "websocket", "proxy", "timeout"):
        assert value(before, "mqkv_handshake_failures", reason=reason) == 0
    # Plain MQTT on the TLS port, twice; an upgrade for another path on the WebSocket one.
    for _ in range(2):
        with socket.create_connection((HOST, server.endpoints["tls"]), timeout=5) as s:
            s.sendall(b"\x10\x0c\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00")
            s.recv(100)
    ws = RawWs(server.endpoints["ws"], path="/elsewhere")
    assert ws.status() == 404
    ws.close()
    wait_for(lambda: value(scrape(server), "mqkv_handshake_failures", reason="websocket") == 1,
             what="the refused upgrade counted")
    after = quiet(server)
    assert delta(before, after, "mqkv_handshake_failures", reason="tls") == 2
    assert delta(before, after, "mqkv_handshake_failures", reason="websocket") == 1
    assert delta(before, after, "mqkv_handshake_failures", reason="timeout") == 0
    # A TLS client that verifies the server is not counted.
    Paho(server, "fine", listener="tls", tls={"ca_certs": str(pki.ca.cert_path)}).disconnect()
    assert delta(after, quiet(server), "mqkv_handshake_failures", reason="tls") == 0
