"""SUBSCRIBE / UNSUBSCRIBE: wildcards, $-topics, shared subscriptions, subscription options,
SUBACK and UNSUBACK reason codes."""

from __future__ import annotations

import pytest

import mqttraw as r
from helpers import V311, Paho, raw_connected, sub_opts, wait_for


def deliveries(server, filters, topics, qos=1):
    """Subscribes to `filters`, publishes one message to each of `topics` (payload = topic)
    and returns the set of topics received."""
    sub = Paho(server, "wild-sub")
    for f in filters:
        assert sub.subscribe(f, qos) == [qos], f"SUBSCRIBE {f!r} refused"
    pub = Paho(server, "wild-pub")
    for t in topics:
        pub.publish(t, t.encode(), qos=1)
    # A marker published last: everything before it has been routed once it arrives.
    assert sub.subscribe("zz/marker", 1) == [1]
    pub.publish("zz/marker", b"end", qos=1)
    got = []
    while True:
        m = sub.get(5)
        if m.topic == "zz/marker":
            break
        assert m.payload == m.topic.encode()
        got.append(m.topic)
    assert len(got) == len(set(got)), f"duplicate deliveries: {got}"
    return set(got)


def test_single_level_wildcard(server):
    got = deliveries(server, ["a/+/c"], ["a/b/c", "a/x/c", "a//c", "a/b/d", "a/b/c/d", "a/c", "b/b/c"])
    assert got == {"a/b/c", "a/x/c", "a//c"}


def test_single_level_wildcard_whole_level_and_root(server):
    got = deliveries(server, ["+/+"], ["a/b", "/b", "a/", "a", "a/b/c"])
    assert got == {"a/b", "/b", "a/"}


def test_multi_level_wildcard(server):
    got = deliveries(server, ["a/#"], ["a", "a/b", "a/b/c", "a/", "b/a", "ab"])
    assert got == {"a", "a/b", "a/b/c", "a/"}


def test_hash_alone_matches_everything_but_dollar_topics(server):
    got = deliveries(server, ["#"], ["x", "x/y", "/lead", "$SYS/broker/load", "$internal/x"])
    # zz/marker also matches '#' but deliveries() stops at it.
    assert got == {"x", "x/y", "/lead"}


def test_dollar_topics_not_matched_by_leading_wildcards(server):
    got = deliveries(server, ["+/status", "+/+/x"], ["$SYS/status", "dev/status", "$a/b/x",
                                                     "d/b/x"])
    assert got == {"dev/status", "d/b/x"}


def test_dollar_topics_matched_explicitly(server):
    got = deliveries(server, ["$SYS/#", "$app/+/x"], ["$SYS/broker/uptime", "$app/1/x",
                                                      "SYS/broker", "$app/1/y"])
    assert got == {"$SYS/broker/uptime", "$app/1/x"}


def test_overlapping_subscriptions_deliver_once_at_max_qos(server):
    sub = Paho(server, "overlap")
    sub.subscribe("ol/+", 0)
    sub.subscribe("ol/#", 2)
    pub = Paho(server, "overlap-pub")
    pub.publish("ol/x", b"m", qos=2)
    got = sub.drain(0.5)
    # MQTT 5 allows one copy per subscription, but at least one copy must carry QoS 2.
    assert got and max(m.qos for m in got) == 2


# -- shared subscriptions -------------------------------------------------------------------------


def test_shared_subscription_load_balanced(server):
    m1 = Paho(server, "member-1")
    m2 = Paho(server, "member-2")
    assert m1.subscribe("$share/g/jobs/+", 1) == [1]
    assert m2.subscribe("$share/g/jobs/+", 1) == [1]
    plain = Paho(server, "plain")
    assert plain.subscribe("jobs/+", 1) == [1]
    other = Paho(server, "other-group")
    assert other.subscribe("$share/h/jobs/+", 1) == [1]
    pub = Paho(server, "jobs-pub")
    for i in range(20):
        pub.publish(f"jobs/{i % 3}", str(i).encode(), qos=1)
    got1 = [int(m.payload) for m in m1.drain(0.5)]
    got2 = [int(m.payload) for m in m2.drain(0.1)]
    assert got1 and got2, f"not load-balanced: member-1 got {got1}, member-2 got {got2}"
    assert len(got1) + len(got2) == 20, f"{len(got1)} + {len(got2)} deliveries for 20 messages"
    assert sorted(got1 + got2) == list(range(20)), "duplicates or losses within the group"
    # Non-shared subscribers and other groups each get everything.
    assert sorted(int(m.payload) for m in plain.collect(20)) == list(range(20))
    assert sorted(int(m.payload) for m in other.collect(20)) == list(range(20))


def test_shared_subscription_member_leaving(server):
    m1 = Paho(server, "stay")
    m2 = Paho(server, "leave")
    m1.subscribe("$share/g2/work", 1)
    m2.subscribe("$share/g2/work", 1)
    assert m2.unsubscribe("$share/g2/work") == [0]
    pub = Paho(server, "work-pub")
    for i in range(6):
        pub.publish("work", str(i).encode(), qos=1)
    assert [int(m.payload) for m in m1.collect(6)] == list(range(6))
    m2.expect_nothing(0.2)


def test_shared_subscription_no_retained_on_subscribe(server):
    Paho(server, "share-ret-pub").publish("sr/t", b"retained", qos=1, retain=True)
    m = Paho(server, "share-ret")
    m.subscribe("$share/g/sr/t", 1)
    m.expect_nothing(0.4)  # [MQTT-3.8.4-4]: retained messages are not sent for shared subs


# -- subscription options -------------------------------------------------------------------------


def test_no_local(server):
    c = Paho(server, "nl")
    c.subscribe("nl/t", options=sub_opts(qos=1, no_local=True))
    other = Paho(server, "nl-other")
    c.publish("nl/t", b"own", qos=1)
    other.publish("nl/t", b"foreign", qos=1)
    m = c.get()
    assert m.payload == b"foreign"
    c.expect_nothing(0.3)


def test_without_no_local_own_messages_arrive(server):
    c = Paho(server, "nl-off")
    c.subscribe("nloff/t", options=sub_opts(qos=1, no_local=False))
    c.publish("nloff/t", b"own", qos=1)
    assert c.get().payload == b"own"


def test_retain_as_published(server):
    rap = Paho(server, "rap")
    rap.subscribe("rap/t", options=sub_opts(qos=1, retain_as_published=True))
    norap = Paho(server, "norap")
    norap.subscribe("rap/t", options=sub_opts(qos=1, retain_as_published=False))
    pub = Paho(server, "rap-pub")
    pub.publish("rap/t", b"r", qos=1, retain=True)
    pub.publish("rap/t", b"n", qos=1, retain=False)
    a, b = rap.collect(2)
    assert (a.payload, a.retain) == (b"r", True)
    assert (b.payload, b.retain) == (b"n", False)
    c, d = norap.collect(2)
    assert (c.payload, c.retain) == (b"r", False)
    assert (d.payload, d.retain) == (b"n", False)


def test_retain_handling_0_sends_on_every_subscribe(server):
    Paho(server, "rh-pub").publish("rh0/t", b"kept", qos=1, retain=True)
    c = Paho(server, "rh0")
    c.subscribe("rh0/t", options=sub_opts(qos=1, retain_handling=0))
    assert c.get().payload == b"kept"
    c.subscribe("rh0/t", options=sub_opts(qos=1, retain_handling=0))
    m = c.get()
    assert (m.payload, m.retain) == (b"kept", True)


def test_retain_handling_1_sends_only_for_new_subscription(server):
    Paho(server, "rh-pub").publish("rh1/t", b"kept", qos=1, retain=True)
    c = Paho(server, "rh1")
    c.subscribe("rh1/t", options=sub_opts(qos=1, retain_handling=1))
    assert c.get().payload == b"kept"
    c.subscribe("rh1/t", options=sub_opts(qos=1, retain_handling=1))
    c.expect_nothing(0.4)


def test_retain_handling_2_never_sends(server):
    Paho(server, "rh-pub").publish("rh2/t", b"kept", qos=1, retain=True)
    c = Paho(server, "rh2")
    c.subscribe("rh2/t", options=sub_opts(qos=1, retain_handling=2))
    c.expect_nothing(0.4)
    # But live messages flow normally.
    Paho(server, "rh-pub2").publish("rh2/t", b"live", qos=1)
    assert c.get().payload == b"live"


def test_retained_delivered_at_subscription_qos(server):
    Paho(server, "rq-pub").publish("rq/t", b"q2", qos=2, retain=True)
    c = Paho(server, "rq")
    c.subscribe("rq/t", 1)
    m = c.get()
    assert (m.payload, m.qos, m.retain) == (b"q2", 1, True)


def test_no_local_on_shared_subscription_is_protocol_error(server):
    c = raw_connected(server, "nl-shared")
    c.send(r.subscribe(1, [("$share/g/t", 0x04 | 1)]))
    assert c.expect_disconnect_and_close().reason == 0x82


# -- SUBACK / UNSUBACK ----------------------------------------------------------------------------

FILTERS = [("a/b", 0), ("c/#", 1), ("a/#/b", 2), ("d/+", 2), ("e+/f", 1), ("g#", 0),
           ("$share/grp/h/+", 1), ("$share/bad+/x", 1), ("$share/g", 0)]


def test_suback_reason_codes_v5(server):
    c = raw_connected(server, "suback5")
    ack = c.subscribe(11, FILTERS)
    assert ack.packet_id == 11
    assert ack.reasons == [0, 1, 0x8F, 2, 0x8F, 0x8F, 1, 0x8F, 0x8F]


def test_suback_reason_codes_v311(server):
    c = raw_connected(server, "suback311", version=r.V311)
    ack = c.subscribe(12, FILTERS[:6])
    assert ack.packet_id == 12
    assert ack.reasons == [0, 1, 0x80, 2, 0x80, 0x80]


def test_suback_via_paho(server):
    # paho refuses to send invalid filters itself, so only granted QoS is checked here; the
    # raw tests above cover refusals.
    c = Paho(server, "suback-paho")
    codes = c.subscribe([("ok/1", sub_opts(0)), ("ok/2", sub_opts(2)), ("ok/+", sub_opts(1))])
    assert codes == [0, 2, 1]
    old = Paho(server, "suback-paho311", version=V311)
    assert old.subscribe([("ok/1", 1), ("ok/#", 2), ("ok/+", 0)]) == [1, 2, 0]


def test_unsuback_reason_codes(server):
    c = Paho(server, "unsub")
    c.subscribe("u/1", 1)
    c.subscribe("$share/g/u/2", 1)
    raw_c = raw_connected(server, "unsub-raw")
    raw_c.subscribe(1, [("u/3", 1)])
    raw_c.send(r.unsubscribe(2, ["u/3", "never/subscribed", "u/3"]))
    ack = raw_c.expect(r.UNSUBACK)
    assert (ack.packet_id, ack.reasons) == (2, [0x00, 0x11, 0x11])
    assert c.unsubscribe("u/1") == [0x00]
    assert c.unsubscribe("u/1") == [0x11]
    assert c.unsubscribe("$share/g/u/2") == [0x00]
    pub = Paho(server, "unsub-pub")
    pub.publish("u/1", b"x", qos=1)
    pub.publish("u/2", b"x", qos=1)
    c.expect_nothing(0.3)


def test_unsuback_v311_has_no_reason_codes(server):
    c = raw_connected(server, "unsub311", version=r.V311)
    c.subscribe(1, [("u311", 1)])
    c.send(r.unsubscribe(2, ["u311", "nothing"], version=r.V311))
    ack = c.expect(r.UNSUBACK)
    assert ack.packet_id == 2 and ack.body == b"\x00\x02", f"3.1.1 UNSUBACK is 2 bytes: {ack!r}"


def test_subscription_replaced_not_duplicated(server):
    c = Paho(server, "replace")
    c.subscribe("rep/t", 0)
    c.subscribe("rep/t", 2)  # replaces the QoS 0 subscription
    Paho(server, "rep-pub").publish("rep/t", b"x", qos=2)
    got = c.drain(0.4)
    assert [(m.payload, m.qos) for m in got] == [(b"x", 2)]


@pytest.mark.parametrize("version", [r.V5, r.V311])
def test_subscribe_many_filters_in_one_packet(server, version):
    c = raw_connected(server, "many-filters", version=version)
    filters = [(f"mf/{i}", i % 3) for i in range(50)]
    ack = c.subscribe(3, filters)
    assert ack.reasons == [i % 3 for i in range(50)]
    wait_for(server.alive, 1)
