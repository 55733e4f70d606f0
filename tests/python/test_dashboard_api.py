"""The dashboard's JSON API: keys with their values, versions and times to live, paged; who may
look and who may change (anonymous viewers on loopback read only; with a password file every
viewer logs in, and the policy decides per key as it does for MQTT clients); the clients and
cluster views; the live feed (server-sent events fed by KEYNOTIFY); the throughput series."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

from dashboard_client import DashboardApi
from helpers import HOST, Paho, wait_for
from statestore import StoreClient
from test_cluster import free_port, status
from test_security import POLICY, login, users  # noqa: F401  (fixture)


def test_keys_view_shows_values_versions_and_ttl(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    store = StoreClient(Paho(server, "writer"), "writer")
    assert store.set("greeting", "hello") == b"+OK\r\n"
    assert store.request("SET", "session", "x", "PX", "600000") == b"+OK\r\n"
    assert store.set(b"bin\xff", b"\x00\x01") == b"+OK\r\n"
    api = DashboardApi(server)
    page = api.keys()
    by_key = {r["key"]["hex"]: r for r in page["records"]}
    assert len(by_key) == 3, page
    greeting = by_key["greeting".encode().hex()]
    assert greeting["value"]["text"] == "hello"
    assert greeting["ttl_ms"] is None
    # The version is the one a GET answers with.
    assert store.get("greeting") == b"$5\r\nhello\r\n"
    assert greeting["version"] == dict(store.last.properties.UserProperty)["__ts"]
    session = by_key["session".encode().hex()]
    assert 590_000 < session["ttl_ms"] <= 600_000
    binary = by_key[b"bin\xff".hex()]
    assert binary["key"]["text"] is None and binary["value"] == {"text": None, "hex": "0001",
                                                                 "size": 2}
    # Patterns as SCAN's.
    assert [r["key"]["text"] for r in api.keys("greet*")["records"]] == ["greeting"]
    assert api.keys("nothing*")["records"] == []


def test_keys_are_paged_in_order(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    store = StoreClient(Paho(server, "writer"), "writer")
    for i in range(23):
        assert store.set(f"k{i:02}", str(i)) == b"+OK\r\n"
    api = DashboardApi(server)
    seen, after, pages = [], None, 0
    while True:
        params = {"limit": "10"} | ({"after": after} if after else {})
        page = api.keys("k*", **params)
        pages += 1
        seen += [r["key"]["text"] for r in page["records"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == [f"k{i:02}" for i in range(23)]
    assert pages == 3
    status, body = api.call("/api/keys?after=zz")
    assert status == 400, body


def test_anonymous_viewers_read_only(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    api = DashboardApi(server)
    status, me = api.call("/api/me")
    assert status == 200 and me["logged_in"] is False and me["login_required"] is False
    status, body = api.call("/api/keys/set", {"key": "k", "value": "v"})
    assert status == 403, body
    # Without the header, refused before anything else.
    status, body = api.call("/api/keys/set", {"key": "k", "value": "v"}, header=False)
    assert status == 403 and "header" in body["error"]
    assert api.keys()["records"] == []


def test_logins_and_the_policy_decide_what_a_viewer_sees_and_changes(mqkv, tmp_path, users):  # noqa: F811
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = mqkv("--http", f"{HOST}:0", "--password-file", users, "--policy", policy)
    alice = StoreClient(login(server, "alice"), "alice-1")
    # alice may write her own keys and shared-config; bob reads shared-config and his own.
    assert alice.set("users:alice:a", "1") == b"+OK\r\n"
    assert alice.set("shared-config", "c") == b"+OK\r\n"
    api = DashboardApi(server)
    status, me = api.call("/api/me")
    assert me["allowed"] is False and me["login_required"] is True
    assert api.call("/api/keys")[0] == 401
    assert api.call("/api/clients")[0] == 401
    started = time.monotonic()
    assert api.login("alice", "wrong") == 401
    assert time.monotonic() - started >= 0.9, "a failed login is answered after a delay"
    assert api.login("nobody", "x") == 401
    assert api.login("bob", "bob-pw") == 200
    status, me = api.call("/api/me")
    assert me["user"] == "bob" and me["logged_in"] is True
    keys = [r["key"]["text"] for r in api.keys()["records"]]
    assert keys == ["shared-config"], "bob sees only what he may read"
    status, body = api.call("/api/keys/set", {"key": "shared-config", "value": "bob was here"})
    assert status == 403 and body["error"] == "not authorized", body
    assert alice.get("shared-config") == b"$1\r\nc\r\n"
    # alice, logged in, writes through the dashboard as she could over MQTT.
    api_alice = DashboardApi(server)
    assert api_alice.login("alice", "alice-pw") == 200
    status, body = api_alice.call("/api/keys/set", {"key": "users:alice:b", "value": "2", "px_ms": 60000})
    assert status == 200 and body["answer"] == "+OK", body
    assert alice.get("users:alice:b") == b"$1\r\n2\r\n"
    assert api_alice.call("/api/keys/set", {"key": "users:bob:x", "value": "no"})[0] == 403
    status, body = api_alice.call("/api/keys/delete", {"key": "users:alice:a"})
    assert status == 200 and body["answer"] == ":1", body
    assert alice.get("users:alice:a") == b"$-1\r\n"
    # After logging out, the cookie is worth nothing.
    assert api_alice.call("/api/logout", {})[0] == 200
    assert api_alice.call("/api/keys")[0] == 401


def test_clients_and_cluster_views(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    c = Paho(server, "viewer-test-client")
    c.subscribe("sensors/#", 1)
    api = DashboardApi(server)
    status, body = api.call("/api/clients")
    assert status == 200
    mine = [s for s in body["sessions"] if s["client_id"] == "viewer-test-client"]
    assert mine and mine[0]["connected"] and mine[0]["protocol_level"] == 5
    assert mine[0]["subscriptions"] == [["sensors/#", 1]]
    status, body = api.call("/api/cluster")
    assert status == 200 and body["clustered"] is False
    assert body["nodes"][0]["role"] == "leader"


def read_events(resp, n: int, timeout: float = 10.0) -> list[dict]:
    """The next `n` server-sent events of a streaming response."""
    events = []
    deadline = time.monotonic() + timeout
    while len(events) < n and time.monotonic() < deadline:
        line = resp.readline().decode().strip()
        if line.startswith("data:"):
            events.append(json.loads(line[5:]))
    return events


def test_live_feed_streams_changes_of_the_watched_keys(mqkv):
    server = mqkv("--http", f"{HOST}:0", config="[state_store]\nmax_observed_keys = 2\n")
    store = StoreClient(Paho(server, "writer"), "writer")
    keys = urllib.parse.quote(json.dumps(["a", "b", "c"]))
    resp = urllib.request.urlopen(f"http://{HOST}:{server.http_port}/api/feed?keys={keys}",
                                  timeout=10)
    assert resp.headers["content-type"].startswith("text/event-stream")
    first = read_events(resp, 3)
    assert [e["kind"] for e in first] == ["observing", "observing", "refused"]
    # The observation quota applies to the viewer as to any client.
    assert first[2]["key"] == "c" and "quota" in first[2]["error"]
    assert store.set("a", "1") == b"+OK\r\n"
    assert store.set("c", "not watched") == b"+OK\r\n"
    assert store.request("DEL", "a") == b":1\r\n"
    assert store.set("b", "2") == b"+OK\r\n"
    changes = read_events(resp, 3)
    assert [(e["kind"], e["key"]["text"], e.get("value", {}).get("text")) for e in changes] == [
        ("set", "a", "1"), ("delete", "a", None), ("set", "b", "2")]
    resp.close()
    # Once the page is gone its observations end: a new feed may observe two keys again.
    two = urllib.parse.quote(json.dumps(["a", "b"]))

    def second_feed_gets_both():
        r = urllib.request.urlopen(f"http://{HOST}:{server.http_port}/api/feed?keys={two}",
                                   timeout=10)
        kinds = [e["kind"] for e in read_events(r, 2)]
        r.close()
        return kinds == ["observing", "observing"]
    wait_for(second_feed_gets_both, timeout=10, what="the closed feed's observations to end")


def test_throughput_series_fills(mqkv):
    server = mqkv("--http", f"{HOST}:0")
    p = Paho(server, "pub")
    api = DashboardApi(server)

    def samples():
        p.publish("t", b"x", qos=1)
        return api.call("/api/series")[1]["samples"]
    wait_for(lambda: len(samples()) >= 2, timeout=15, interval=0.5, what="two samples")
    s = samples()
    assert all(x["publishes_received"] >= 0 for x in s)
    assert any(x["publishes_received"] > 0 for x in s), s
    assert s[-1]["connected"] >= 1


def test_a_cluster_seen_from_a_follower(mqkv, tmp_path):
    ports = [free_port() for _ in range(3)]
    peers = [arg for i, p in enumerate(ports) for arg in ("--peer", f"{i + 1}=127.0.0.1:{p}")]
    nodes = [mqkv("--http", f"{HOST}:0", "--node-id", str(i + 1), "--cluster-listen",
                  f"127.0.0.1:{port}", *peers, "--storage", "disk", "--data-dir",
                  str(tmp_path / f"n{i + 1}")) for i, port in enumerate(ports)]

    def settled():
        s = status(nodes[0])
        return s is not None and s.get("leader") is not None and all(
            n.get("role") in ("leader", "follower") for n in s["nodes"])
    wait_for(settled, timeout=30, interval=0.2, what="a leader and two followers")
    leader = status(nodes[0])["leader"]
    follower = nodes[leader % 3]  # a node that is not the leader
    api = DashboardApi(follower)
    status_code, body = api.call("/api/cluster")
    assert status_code == 200 and body["clustered"] is True, body
    roles = sorted(n["role"] for n in body["status"]["nodes"])
    assert roles == ["follower", "follower", "leader"], body
    # A key written on the leader is in the follower's keys view, and its change in the
    # follower's live feed.
    keys = urllib.parse.quote(json.dumps(["shared"]))
    feed = urllib.request.urlopen(
        f"http://{HOST}:{follower.http_port}/api/feed?keys={keys}", timeout=10)
    assert [e["kind"] for e in read_events(feed, 1)] == ["observing"]
    writer = StoreClient(Paho(nodes[leader - 1], "writer"), "writer")
    assert writer.set("shared", "from the leader") == b"+OK\r\n"
    assert [r["value"]["text"] for r in api.keys("shared")["records"]] == ["from the leader"]
    change = read_events(feed, 1)
    assert change and change[0]["value"]["text"] == "from the leader", change
    feed.close()
