"""The broker across a three-node cluster, with paho-mqtt clients: publish/subscribe between
nodes at every QoS, retained messages as cluster state, client ids unique across the cluster
(session takeover with DISCONNECT 0x8E) and persistent sessions resumed on another node.

Every test starts its own three `mqkv serve` processes (durable storage, loopback ports)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from helpers import MQKV_BIN, V5, Paho, props, wait_for
from paho.mqtt.packettypes import PacketTypes

SESSION_TAKEN_OVER = 0x8E
NO_MATCHING_SUBSCRIBERS = 0x10


_LOW, _SPAN = 10_000, 22_000
_next_port = _LOW + (os.getpid() * 7_919) % _SPAN


def free_port() -> int:
    """A port nobody listens on now, for a cluster node's address, which its peers must know
    before it starts. Chosen below the kernel's ephemeral range (32768 and up), so the port-0
    listeners and outgoing connections of the nodes starting meanwhile cannot take it first.
    Each call goes on from where the last one stopped."""
    global _next_port
    for _ in range(_SPAN):
        port = _next_port
        _next_port = _LOW + (_next_port - _LOW + 1) % _SPAN
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def status(node) -> dict | None:
    out = subprocess.run(
        [MQKV_BIN, "cluster", "status", "--json", "--port", str(node.port)],
        capture_output=True,
        timeout=10,
    )
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


@pytest.fixture
def cluster(mqkv, tmp_path):
    """Three nodes that formed one group and elected a leader; a list indexed 0..2."""
    ports = [free_port() for _ in range(3)]
    peers = [arg for i, p in enumerate(ports) for arg in ("--peer", f"{i + 1}=127.0.0.1:{p}")]
    nodes = []
    for i, port in enumerate(ports):
        nodes.append(
            mqkv(
                "--node-id", str(i + 1),
                "--cluster-listen", f"127.0.0.1:{port}",
                *peers,
                "--storage", "disk",
                "--data-dir", str(tmp_path / f"n{i + 1}"),
            )
        )

    def settled():
        s = status(nodes[0])
        return s is not None and s.get("leader") is not None and all(
            n.get("role") in ("leader", "follower") for n in s["nodes"]
        )

    wait_for(settled, timeout=30, interval=0.2, what="a leader and two followers")
    return nodes


def routed(publisher: Paho, subscriber: Paho, topic: str) -> None:
    """Waits until a message published on `topic` through `publisher`'s node reaches
    `subscriber` (a subscription takes effect on other nodes a moment after its SUBACK),
    then drops the probes."""

    def probe():
        publisher.publish(topic, b"probe", qos=0)
        try:
            m = subscriber.messages.get(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty
            return False
        return m.payload == b"probe"

    wait_for(probe, timeout=10, interval=0.05, what=f"a route for {topic}")
    subscriber.drain(quiet=0.3)


def test_messages_cross_nodes_once_and_in_order_at_every_qos(cluster):
    sub = Paho(cluster[2], "sub-x")
    assert sub.subscribe("x/#", qos=2) == [2]
    pub = Paho(cluster[0], "pub-x")
    routed(pub, sub, "x/probe")
    for qos in (0, 1, 2):
        for i in range(20):
            pub.publish(f"x/{qos}", f"{qos}:{i}".encode(), qos=qos)
    got = sub.collect(60, timeout=10)
    for qos in (0, 1, 2):
        mine = [m for m in got if m.topic == f"x/{qos}"]
        assert [m.payload.decode() for m in mine] == [f"{qos}:{i}" for i in range(20)]
        assert all(m.qos == qos for m in mine)
    sub.expect_nothing(within=0.5)


def test_retained_messages_are_cluster_state_and_survive_their_node(cluster):
    pub = Paho(cluster[0], "pub-r")
    # 0x10: no subscriber anywhere yet; the message is kept all the same.
    assert pub.publish("r/a", b"kept", qos=1, retain=True) in (0, NO_MATCHING_SUBSCRIBERS)
    assert pub.publish("r/b", b"cleared later", qos=1, retain=True) in (0, NO_MATCHING_SUBSCRIBERS)

    def retained_on(node, topic_filter):
        c = Paho(node, "")
        c.subscribe(topic_filter, qos=1)
        got = {m.topic: m.payload for m in c.drain(quiet=0.5)}
        c.close()
        return got

    wait_for(
        lambda: retained_on(cluster[2], "r/#") == {"r/a": b"kept", "r/b": b"cleared later"},
        timeout=10, what="retained messages on another node",
    )
    # Cleared through a second node, gone on the third.
    other = Paho(cluster[1], "pub-r2")
    other.publish("r/b", b"", qos=1, retain=True)
    wait_for(lambda: retained_on(cluster[2], "r/#") == {"r/a": b"kept"},
             timeout=10, what="the cleared retained message gone everywhere")
    pub.close()
    # The node it was published on dies; the others keep it.
    cluster[0].proc.kill()
    cluster[0].proc.wait()
    cluster[0].stopped = True
    for node in cluster[1:]:
        assert retained_on(node, "r/#") == {"r/a": b"kept"}


def test_a_client_id_is_taken_over_across_nodes(cluster):
    first = Paho(cluster[0], "roaming-id")
    assert first.subscribe("t/first", qos=1) == [1]
    second = Paho(cluster[1], "roaming-id")
    assert first.wait_disconnected(timeout=10) == SESSION_TAKEN_OVER
    assert second.connected.is_set()
    # The session on the first node ended: its subscription no longer delivers there.
    probe = Paho(cluster[0], "probe")
    probe.publish("t/first", b"nobody", qos=1)
    second.expect_nothing(within=0.5)
    # And the id moves back again.
    third = Paho(cluster[2], "roaming-id")
    assert second.wait_disconnected(timeout=10) == SESSION_TAKEN_OVER
    assert third.connected.is_set()


def test_a_persistent_session_resumes_on_another_node(cluster):
    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    c = Paho(cluster[0], "resumer", clean_start=True, properties=expiry)
    assert not c.session_present
    assert c.subscribe("resume/#", qos=1) == [1]
    # Give the session's record a moment to reach the log.
    time.sleep(0.5)
    c.disconnect()

    resumed = Paho(cluster[1], "resumer", clean_start=False, properties=expiry)
    assert resumed.session_present, "the session kept by the cluster was not resumed"
    pub = Paho(cluster[2], "pub-resume")
    routed(pub, resumed, "resume/probe")
    pub.publish("resume/x", b"after the move", qos=1)
    m = resumed.get(timeout=5)
    assert (m.topic, m.payload, m.qos) == ("resume/x", b"after the move", 1)

    # Starting clean on a third node drops the kept session.
    resumed.disconnect()
    fresh = Paho(cluster[2], "resumer", clean_start=True, properties=expiry)
    assert not fresh.session_present
    fresh.disconnect()
    again = Paho(cluster[0], "resumer", clean_start=False, properties=expiry)
    assert again.session_present, "a session with expiry 300 s ended early"
    pub.publish("resume/y", b"not subscribed any more", qos=1)
    again.expect_nothing(within=1.0)


def test_a_v5_client_connecting_to_any_node_gets_a_session(cluster):
    for node in cluster:
        c = Paho(node, f"plain-{node.port}", version=V5)
        assert c.connected.is_set()
        c.disconnect()


def test_a_shared_subscription_balances_across_nodes_and_delivers_once(cluster):
    members = [Paho(node, f"member-{i}") for i, node in enumerate(cluster)]
    for m in members:
        assert m.subscribe("$share/workers/jobs/#", qos=1) == [1]
    plain = Paho(cluster[1], "plain-jobs")
    assert plain.subscribe("jobs/#", qos=1) == [1]
    pub = Paho(cluster[0], "pub-jobs")

    # Until every node knows every group member, probes go to the members it knows.
    def all_members_reached():
        pub.publish("jobs/probe", b"probe", qos=1)
        return all(not m.messages.empty() for m in members)

    wait_for(all_members_reached, timeout=10, interval=0.05, what="probes at every member")
    time.sleep(0.3)
    for c in (*members, plain):
        c.drain(quiet=0.3)

    n = 60
    for i in range(n):
        pub.publish("jobs/x", str(i).encode(), qos=1)
    assert sorted(int(m.payload) for m in plain.collect(n, timeout=10)) == list(range(n))
    got = [[int(m.payload) for m in member.drain(quiet=0.7)] for member in members]
    everything = sorted(p for mine in got for p in mine)
    assert everything == list(range(n)), f"each message once across the group: {got}"
    # The publishing node hands the group's turn to each node in rotation.
    assert all(len(mine) >= n // 6 for mine in got), [len(mine) for mine in got]


def test_a_dead_nodes_clients_wills_are_published_by_the_survivors(cluster):
    leader = status(cluster[0])["leader"]
    doomed = next(n for i, n in enumerate(cluster) if i + 1 != leader)
    watcher_node = next(n for n in cluster if n is not doomed)
    watcher = Paho(watcher_node, "will-watcher")
    assert watcher.subscribe("wills/#", qos=1) == [1]

    expiry = props(PacketTypes.CONNECT, SessionExpiryInterval=60)
    Paho(doomed, "mortal", will={"topic": "wills/mortal", "payload": b"gone", "qos": 1})
    # A will delayed by 3 s whose client comes back on another node in time: cancelled.
    delayed_will = props(PacketTypes.WILLMESSAGE, WillDelayInterval=3)
    Paho(doomed, "returning", properties=expiry,
         will={"topic": "wills/returning", "payload": b"gone", "qos": 1,
               "properties": delayed_will})
    time.sleep(0.5)  # the wills reach the log

    doomed.proc.kill()
    doomed.proc.wait()
    doomed.stopped = True
    Paho(watcher_node, "returning", clean_start=False, properties=expiry)

    m = watcher.get(timeout=20)
    assert (m.topic, m.payload) == ("wills/mortal", b"gone")
    watcher.expect_nothing(within=5)
