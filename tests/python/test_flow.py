"""Flow control: receive maximum both ways, bounded offline queues, stalled subscribers."""

from __future__ import annotations

import time

import pytest

import mqttraw as r
from helpers import HOST, PacketTypes, Paho, props, raw_connected, wait_for

CONNECT = PacketTypes.CONNECT


def no_packet(c: r.RawClient, within: float):
    """Asserts the broker sends nothing for `within` seconds."""
    try:
        p = c.recv_packet(within)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected packet {p!r}")


def test_receive_maximum_outbound_qos1(server):
    sub = raw_connected(server, "slow-acker", props=[(r.RECEIVE_MAXIMUM, 2)])
    assert sub.subscribe(1, [("rm/t", 1)]).reasons == [1]
    pub = Paho(server, "rm-pub")
    for i in range(10):
        pub.publish("rm/t", str(i).encode(), qos=1)
    first = [sub.next_publish(), sub.next_publish()]
    no_packet(sub, 0.7)  # a third would exceed the client's Receive Maximum of 2
    got = [p.payload for p in first]
    outstanding = [p.packet_id for p in first]
    assert len(set(outstanding)) == 2
    while len(got) < 10:
        sub.send(r.ack(r.PUBACK, outstanding.pop(0)))
        p = sub.next_publish(3)
        assert p.qos == 1
        got.append(p.payload)
        outstanding.append(p.packet_id)
        if len(got) < 10:
            no_packet(sub, 0.1)
    assert got == [str(i).encode() for i in range(10)]


def test_receive_maximum_outbound_qos2_counts_until_pubcomp(server):
    sub = raw_connected(server, "slow-q2", props=[(r.RECEIVE_MAXIMUM, 1)])
    sub.subscribe(1, [("rm2/t", 2)])
    pub = Paho(server, "rm2-pub")
    pub.publish("rm2/t", b"a", qos=2)
    pub.publish("rm2/t", b"b", qos=2)
    p = sub.next_publish()
    assert p.payload == b"a" and p.qos == 2
    sub.send(r.ack(r.PUBREC, p.packet_id))
    rel = sub.expect(r.PUBREL)
    assert rel.packet_id == p.packet_id
    no_packet(sub, 0.5)  # still in flight until PUBCOMP
    sub.send(r.ack(r.PUBCOMP, p.packet_id))
    assert sub.next_publish().payload == b"b"


def test_receive_maximum_inbound_exceeded(mqkv):
    s = mqkv("--receive-maximum", "3")
    c = raw_connected(s, "flood")
    assert c.connack.prop(r.RECEIVE_MAXIMUM) == 3
    for pid in (1, 2, 3):
        c.publish("flood/t", b"x", qos=2, packet_id=pid)
        rec = c.expect(r.PUBREC)
        assert (rec.packet_id, rec.reason) == (pid, 0x10)
    # Completing one frees a slot.
    c.send(r.ack(r.PUBREL, 1))
    assert c.expect(r.PUBCOMP).packet_id == 1
    c.publish("flood/t", b"x", qos=2, packet_id=4)
    assert c.expect(r.PUBREC).packet_id == 4
    # Now 2, 3 and 4 are open: a fourth unacknowledged one exceeds the maximum.
    c.publish("flood/t", b"x", qos=2, packet_id=5)
    d = c.expect_disconnect_and_close()
    assert d.reason == 0x93, f"expected DISCONNECT 0x93 Receive Maximum exceeded, got {d!r}"


@pytest.mark.parametrize("policy,expected", [
    (None, [0, 1, 2, 3, 4]),
    ("drop-new", [0, 1, 2, 3, 4]),
    ("drop-oldest", [5, 6, 7, 8, 9]),
])
def test_offline_queue_bound(mqkv, policy, expected):
    args = ["--max-queued-messages", "5"]
    if policy:
        args += ["--queue-full", policy]
    s = mqkv(*args)
    sub = Paho(s, "offline", properties=props(CONNECT, SessionExpiryInterval=60))
    sub.subscribe("q/t", 1)
    sub.disconnect()
    pub = Paho(s, "q-pub")
    for i in range(10):
        pub.publish("q/t", str(i).encode(), qos=1)
    sub = Paho(s, "offline", clean_start=False,
               properties=props(CONNECT, SessionExpiryInterval=60))
    assert sub.session_present
    got = [int(m.payload) for m in sub.drain(0.6)]
    assert got == expected


def test_qos0_not_queued_for_offline_session(server):
    sub = Paho(server, "offline0", properties=props(CONNECT, SessionExpiryInterval=60))
    sub.subscribe("q0/t", 1)
    sub.disconnect()
    pub = Paho(server, "q0-pub")
    pub.publish("q0/t", b"qos0", qos=0)
    pub.publish("q0/t", b"qos1", qos=1)
    sub = Paho(server, "offline0", clean_start=False,
               properties=props(CONNECT, SessionExpiryInterval=60))
    got = [m.payload for m in sub.drain(0.5)]
    assert b"qos1" in got
    # Queuing QoS 0 messages is optional in MQTT 5 [3.1.2.4]; order must hold if it is done.
    assert got in ([b"qos1"], [b"qos0", b"qos1"])


def test_unacked_messages_redelivered_on_resume(server):
    sub = raw_connected(server, "redeliver", props=[(r.SESSION_EXPIRY_INTERVAL, 60)])
    sub.subscribe(1, [("rd/t", 1)])
    Paho(server, "rd-pub").publish("rd/t", b"unacked", qos=1)
    p = sub.next_publish()
    assert p.dup is False
    sub.disconnect()
    sub.wait_closed()
    again = raw_connected(server, "redeliver", clean_start=False,
                          props=[(r.SESSION_EXPIRY_INTERVAL, 60)])
    assert again.connack.session_present
    q = again.next_publish()
    assert (q.payload, q.dup, q.qos, q.packet_id) == (b"unacked", True, 1, p.packet_id)


def test_stalled_subscriber_does_not_stall_others(server):
    stalled = raw_connected(server, "stalled", rcvbuf=4096)
    assert stalled.subscribe(1, [("load/#", 1), ("stall/#", 0)]).reasons == [1, 0]
    # From here on the stalled client never reads again. 8 MiB only it receives fill its
    # receive buffer and the broker's socket send buffer (at most 4 MiB here), so the broker
    # really cannot write to it any more.
    pub = Paho(server, "loader", max_inflight=50)
    for _ in range(8):
        pub.publish("stall/fill", b"\x00" * (1 << 20), qos=1)
    healthy = Paho(server, "healthy")
    assert healthy.subscribe("load/#", 1) == [1]
    payload = b"\xa5" * 1024
    n = 2000
    start = time.monotonic()
    infos = [pub.publish(f"load/{i % 10}", payload + i.to_bytes(4, "big"), qos=1, wait=False)
             for i in range(n)]
    deadline = start + 40
    for info in infos:
        info.wait_for_publish(max(0.1, deadline - time.monotonic()))
        assert info.is_published(), "publisher stalled: PUBACKs stopped coming"
    published = time.monotonic() - start
    got = healthy.collect(n, timeout=max(5.0, deadline - time.monotonic()))
    seqs = sorted(int.from_bytes(m.payload[-4:], "big") for m in got)
    assert seqs == list(range(n))
    elapsed = time.monotonic() - start
    print(f"published {n} in {published:.1f}s, all received in {elapsed:.1f}s")
    assert server.alive()
    # The broker still serves new clients while the stalled one is stuck.
    late = Paho(server, "late-client")
    assert late.subscribe("other/t", 1) == [1]
    pub.publish("other/t", b"still fine", qos=1)
    assert late.get().payload == b"still fine"
    stalled.abort()
    wait_for(server.alive, 1)


def test_message_expiring_while_held_back_by_receive_maximum(server):
    sub = raw_connected(server, "held-back", props=[(r.RECEIVE_MAXIMUM, 1)])
    sub.subscribe(1, [("held/t", 1)])
    pub = Paho(server, "held-pub")
    pub.publish("held/t", b"A", qos=1)
    pub.publish("held/t", b"B expires", qos=1, properties=props(PacketTypes.PUBLISH,
                                                                 MessageExpiryInterval=1))
    a = sub.next_publish()
    assert a.payload == b"A"
    time.sleep(2.0)  # B waits behind the unacknowledged A and expires meanwhile
    sub.send(r.ack(r.PUBACK, a.packet_id))
    pub.publish("held/t", b"C", qos=1)
    nxt = sub.next_publish()
    assert nxt.payload == b"C", f"expired message delivered: {nxt!r}"


def test_a_client_still_sending_reads_the_disconnect_reason(mqkv):
    """The server ends a connection (Receive Maximum exceeded) while the client keeps sending:
    the client still reads DISCONNECT 0x93 before the connection closes, instead of meeting a
    reset that destroys it (the Eclipse Paho interoperability test test_flow_control2)."""
    s = mqkv("--receive-maximum", "3")
    c = raw_connected(s, "keeps-sending")
    # Four QoS 2 publishes in one go: the fourth exceeds the maximum.
    c.send(b"".join(r.publish("flood/t", b"x", qos=2, packet_id=pid) for pid in range(1, 5)))
    # The client goes on sending for a while, as a client that has not read yet does. Its
    # writes must not meet a reset: a client like paho treats one as the connection lost and
    # never reads what arrived before it.
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        c.send(r.pingreq() * 64)
        time.sleep(0.005)
    packets = []
    try:
        while True:
            packets.append(c.recv_packet(timeout=5))
    except r.Closed:
        pass
    reasons = [p.reason for p in packets if p.type == r.DISCONNECT]
    assert reasons == [0x93], f"packets read before the close: {packets!r}"


def test_every_retained_message_reaches_a_wildcard_subscriber_paced(mqkv):
    """Ten times more retained messages than a session queue holds: the subscriber gets all
    of them, once each, as fast as it acknowledges them; a live publish on a topic whose
    retained message is still waiting replaces it instead of being followed by it."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    server = mqkv("--max-queued-messages", "20")
    pub = Paho(server, "paced-pub")
    for i in range(200):
        assert pub.publish(f"paced/{i:03}", f"r{i}".encode(), qos=1, retain=True) in (0, 16)
    props = Properties(PacketTypes.CONNECT)
    props.ReceiveMaximum = 5
    sub = Paho(server, "paced-sub", properties=props, manual_ack=True)
    sub.subscribe("paced/#", 1)
    # Five in flight, unacknowledged: the rest wait in the queue and behind it.
    got = sub.collect(5)
    sub.expect_nothing(0.3)
    assert pub.publish("paced/199", b"live", qos=1) == 0
    for m in got:
        sub.client.ack(m.mid, m.qos)
    while len(got) < 200:
        m = sub.get(timeout=10)
        got.append(m)
        sub.client.ack(m.mid, m.qos)
    by_topic = {}
    for m in got:
        by_topic.setdefault(m.topic, []).append(m.payload)
    assert len(by_topic) == 200
    assert all(len(v) == 1 for v in by_topic.values()), by_topic
    assert by_topic["paced/199"] == [b"live"]
    assert by_topic["paced/100"] == [b"r100"]
    sub.expect_nothing(0.5)


def test_all_queues_together_stay_within_their_byte_budget(mqkv):
    """Five offline sessions would queue a megabyte between them; the budget holds them to
    100 kB together, drops the rest under the queue policy (counted), and once the sessions
    have been served the budget is all free again."""
    from paho.mqtt.properties import Properties

    from test_metrics import quiet, value

    server = mqkv("--http", f"{HOST}:0", "--max-queued-bytes", "100000")
    expiry = Properties(PacketTypes.CONNECT)
    expiry.SessionExpiryInterval = 300
    for i in range(5):
        c = Paho(server, f"budget-{i}", clean_start=False, properties=expiry)
        assert c.subscribe("budget/#", 1) == [1]
        c.disconnect()
    pub = Paho(server, "budget-pub")
    for i in range(200):
        pub.publish(f"budget/{i}", b"x" * 1000, qos=1)
    m = quiet(server)
    assert value(m, "mqkv_queued_bytes_limit") == 100000
    assert 90000 < value(m, "mqkv_queued_bytes") <= 100000
    assert value(m, "mqkv_queue_dropped_messages", policy="drop-new") > 900
    received = 0
    for i in range(5):
        c = Paho(server, f"budget-{i}", clean_start=False, properties=expiry)
        received += len(c.drain(quiet=0.5))
    # About 100 kB of 1 kB messages, over all five sessions together.
    assert 85 <= received <= 100, received
    assert value(quiet(server), "mqkv_queued_bytes") == 0
