"""PUBLISH: QoS flows, retained messages, topic aliases, message expiry, payload format,
property forwarding, subscription identifiers."""

from __future__ import annotations

import time

import pytest

import mqttraw as r
from helpers import (
    V5, V311, PacketTypes, Paho, prop, props, raw_connected,
)

CONNECT = PacketTypes.CONNECT
PUBLISH = PacketTypes.PUBLISH
SUBSCRIBE = PacketTypes.SUBSCRIBE

VERSIONS = {"v5": V5, "v311": V311}


# -- QoS 0/1/2 with paho --------------------------------------------------------------------------


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("sub_v", ["v5", "v311"])
@pytest.mark.parametrize("pub_v", ["v5", "v311"])
def test_qos_roundtrip_paho(server, pub_v, sub_v, qos):
    sub = Paho(server, f"sub-{sub_v}", version=VERSIONS[sub_v])
    assert sub.subscribe("qos/+", 2) == [2]
    pub = Paho(server, f"pub-{pub_v}", version=VERSIONS[pub_v])
    payloads = [bytes([qos, i]) + b"\x00\xffpayload" for i in range(5)]
    for p in payloads:
        rc = pub.publish(f"qos/{qos}", p, qos=qos)
        assert rc == 0, f"publish acknowledged with reason {rc:#x}"
    got = sub.collect(5)
    assert [m.payload for m in got] == payloads, "lost, duplicated or reordered messages"
    for m in got:
        assert m.topic == f"qos/{qos}"
        assert m.qos == qos
        assert m.retain is False
    sub.expect_nothing(0.2)


@pytest.mark.parametrize("sub_qos,pub_qos,expected", [(0, 2, 0), (1, 2, 1), (0, 1, 0), (2, 1, 1)])
def test_delivered_qos_is_minimum_of_publish_and_subscription(server, sub_qos, pub_qos, expected):
    sub = Paho(server, "sub")
    assert sub.subscribe("min/qos", sub_qos) == [sub_qos]
    pub = Paho(server, "pub")
    pub.publish("min/qos", b"x", qos=pub_qos)
    assert sub.get().qos == expected


def test_qos2_handshake_on_the_wire_both_directions(server):
    sub = raw_connected(server, "raw-sub")
    assert sub.subscribe(1, [("wire/q2", 2)]).reasons == [2]
    pub = raw_connected(server, "raw-pub")
    # Inbound: PUBLISH -> PUBREC -> PUBREL -> PUBCOMP.
    pub.publish("wire/q2", b"exactly once", qos=2, packet_id=77)
    rec = pub.expect(r.PUBREC)
    assert (rec.packet_id, rec.reason) == (77, 0)
    pub.send(r.ack(r.PUBREL, 77))
    comp = pub.expect(r.PUBCOMP)
    assert (comp.packet_id, comp.reason) == (77, 0)
    # Outbound: PUBLISH -> PUBREC -> PUBREL -> PUBCOMP.
    m = sub.next_publish()
    assert (m.topic, m.payload, m.qos, m.dup) == ("wire/q2", b"exactly once", 2, False)
    assert m.packet_id and m.packet_id > 0
    sub.send(r.ack(r.PUBREC, m.packet_id))
    rel = sub.expect(r.PUBREL)
    assert rel.packet_id == m.packet_id and rel.flags == 0x02
    sub.send(r.ack(r.PUBCOMP, m.packet_id))
    sub.send(r.pingreq())
    assert sub.expect(r.PINGRESP).type == r.PINGRESP  # nothing else (no redelivery) in between


def test_qos2_inbound_duplicate_delivered_once(server):
    sub = Paho(server, "dup-sub")
    assert sub.subscribe("dup/t", 2) == [2]
    pub = raw_connected(server, "dup-pub")
    pub.publish("dup/t", b"once", qos=2, packet_id=5)
    assert pub.expect(r.PUBREC).packet_id == 5
    pub.publish("dup/t", b"once", qos=2, packet_id=5, dup=True)  # PUBREC lost, say
    assert pub.expect(r.PUBREC).packet_id == 5
    pub.send(r.ack(r.PUBREL, 5))
    assert pub.expect(r.PUBCOMP).reason == 0
    assert sub.get().payload == b"once"
    sub.expect_nothing(0.5)


def test_qos1_publish_without_subscribers_gets_0x10(server):
    pub = raw_connected(server, "lonely")
    pub.publish("nobody/listens", b"x", qos=1, packet_id=3)
    ack = pub.expect(r.PUBACK)
    assert (ack.packet_id, ack.reason) == (3, 0x10)


def test_qos1_publish_with_subscriber_gets_0x00(server):
    Paho(server, "listener").subscribe("somebody/listens", 0)
    pub = raw_connected(server, "talker")
    pub.publish("somebody/listens", b"x", qos=1, packet_id=4)
    ack = pub.expect(r.PUBACK)
    assert (ack.packet_id, ack.reason) == (4, 0x00)


def test_large_payload(server):
    sub = Paho(server, "big-sub")
    sub.subscribe("big/t", 1)
    pub = Paho(server, "big-pub")
    payload = bytes(range(256)) * 1024  # 256 KiB
    pub.publish("big/t", payload, qos=1)
    assert sub.get().payload == payload


def test_client_maximum_packet_size_respected(server):
    # A message larger than the client's Maximum Packet Size is not sent to it
    # [MQTT-3.1.2-24]; later messages still are.
    sub = Paho(server, "small-sub", properties=props(CONNECT, MaximumPacketSize=256))
    sub.subscribe("size/t", 1)
    pub = Paho(server, "size-pub")
    pub.publish("size/t", b"x" * 1024, qos=1)
    pub.publish("size/t", b"small", qos=1)
    m = sub.get()
    assert m.payload == b"small"
    sub.expect_nothing(0.3)


# -- retained -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v5", "v311"])
def test_retained_message(server, version):
    v = VERSIONS[version]
    live = Paho(server, "live", version=v)
    live.subscribe("ret/t", 1)
    pub = Paho(server, "ret-pub", version=v)
    pub.publish("ret/t", b"kept", qos=1, retain=True)
    m = live.get()
    assert (m.payload, m.retain) == (b"kept", False), "live delivery must clear the retain flag"
    late = Paho(server, "late", version=v)
    late.subscribe("ret/t", 1)
    m = late.get()
    assert (m.topic, m.payload, m.retain, m.qos) == ("ret/t", b"kept", True, 1)
    # A newer retained message replaces it.
    pub.publish("ret/t", b"newer", qos=1, retain=True)
    later = Paho(server, "later", version=v)
    later.subscribe("ret/+", 0)
    m = later.get()
    assert (m.payload, m.retain, m.qos) == (b"newer", True, 0)
    later.expect_nothing(0.2)


def test_retained_cleared_by_empty_payload(server):
    pub = Paho(server, "clr-pub")
    pub.publish("clr/t", b"soon gone", qos=1, retain=True)
    pub.publish("clr/t", b"", qos=1, retain=True)
    sub = Paho(server, "clr-sub")
    sub.subscribe("clr/#", 1)
    sub.expect_nothing(0.5)


def test_retained_message_expiry(server):
    pub = Paho(server, "rexp-pub")
    pub.publish("rexp/t", b"short-lived", qos=1, retain=True,
                properties=props(PUBLISH, MessageExpiryInterval=1))
    pub.publish("rexp/keep", b"forever", qos=1, retain=True)
    now = Paho(server, "rexp-now")
    now.subscribe("rexp/t", 1)
    m = now.get()
    assert m.payload == b"short-lived" and m.retain is True
    assert prop(m.properties, "MessageExpiryInterval") == 1
    time.sleep(2.0)
    later = Paho(server, "rexp-later")
    later.subscribe("rexp/#", 1)
    m = later.get()
    assert m.payload == b"forever"
    later.expect_nothing(0.3)


# -- topic aliases --------------------------------------------------------------------------------


def test_topic_alias_inbound_paho(server):
    sub = Paho(server, "alias-sub")
    sub.subscribe("alias/in/#", 1)
    pub = Paho(server, "alias-pub")
    assert prop(pub.connack_props, "TopicAliasMaximum", 0) >= 1
    pub.publish("alias/in/long/topic", b"first", qos=1, properties=props(PUBLISH, TopicAlias=1))
    pub.publish("", b"second", qos=1, properties=props(PUBLISH, TopicAlias=1))
    # Re-map alias 1 to another topic.
    pub.publish("alias/in/other", b"third", qos=1, properties=props(PUBLISH, TopicAlias=1))
    pub.publish("", b"fourth", qos=1, properties=props(PUBLISH, TopicAlias=1))
    got = [(m.topic, m.payload) for m in sub.collect(4)]
    assert got == [
        ("alias/in/long/topic", b"first"),
        ("alias/in/long/topic", b"second"),
        ("alias/in/other", b"third"),
        ("alias/in/other", b"fourth"),
    ]
    # Aliases are not forwarded to a subscriber that did not ask for them.
    sub2 = Paho(server, "alias-sub2")
    sub2.subscribe("alias/in/x", 0)
    pub.publish("alias/in/x", b"y", qos=1, properties=props(PUBLISH, TopicAlias=2))
    m = sub2.get()
    assert m.topic == "alias/in/x" and prop(m.properties, "TopicAlias") is None


def test_topic_alias_outbound_paho(server):
    # paho 2.x hands aliased publishes to the application as they are on the wire: the
    # application keeps the alias map, as here.
    sub = Paho(server, "out-alias", properties=props(CONNECT, TopicAliasMaximum=5))
    sub.subscribe("alias/out/+", 1)
    pub = Paho(server, "out-pub")
    for i in range(3):
        pub.publish("alias/out/a", f"a{i}".encode(), qos=1)
    pub.publish("alias/out/b", b"b0", qos=1)
    pub.publish("alias/out/b", b"b1", qos=1)
    aliases: dict[int, str] = {}
    resolved = []
    raw_seen = []
    for m in sub.collect(5):
        alias = prop(m.properties, "TopicAlias")
        assert alias is not None and 1 <= alias <= 5, f"no valid alias on {m.topic!r}"
        if m.topic:
            aliases[alias] = m.topic
        else:
            assert alias in aliases, f"alias {alias} used before it was set"
        resolved.append((aliases[alias], m.payload))
        raw_seen.append(m.topic)
    assert resolved == [("alias/out/a", b"a0"), ("alias/out/a", b"a1"), ("alias/out/a", b"a2"),
                        ("alias/out/b", b"b0"), ("alias/out/b", b"b1")]
    assert raw_seen == ["alias/out/a", "", "", "alias/out/b", ""], (
        "repeat deliveries should use the alias with an empty topic"
    )
    assert len(set(aliases)) == 2


def test_topic_alias_outbound_on_the_wire(server):
    sub = raw_connected(server, "wire-alias", props=[(r.TOPIC_ALIAS_MAXIMUM, 2)])
    sub.subscribe(1, [("wire/alias/#", 0)])
    pub = Paho(server, "wire-alias-pub")
    pub.publish("wire/alias/topic", b"1", qos=1)
    pub.publish("wire/alias/topic", b"2", qos=1)
    first = sub.next_publish()
    second = sub.next_publish()
    assert first.topic == "wire/alias/topic" and first.payload == b"1"
    alias = first.prop(r.TOPIC_ALIAS)
    assert alias is not None and 1 <= alias <= 2
    assert second.topic == "", f"second delivery should use the alias only: {second!r}"
    assert second.prop(r.TOPIC_ALIAS) == alias and second.payload == b"2"
    # More topics than the client allows: never an alias above its maximum.
    for t in ("wire/alias/x", "wire/alias/y", "wire/alias/z"):
        pub.publish(t, b"-", qos=1)
    for _ in range(3):
        p = sub.next_publish()
        a = p.prop(r.TOPIC_ALIAS)
        assert a is None or 1 <= a <= 2
        assert p.topic or a is not None


def test_no_topic_alias_without_client_maximum(server):
    sub = raw_connected(server, "no-alias")
    sub.subscribe(1, [("noalias/t", 0)])
    pub = Paho(server, "no-alias-pub")
    pub.publish("noalias/t", b"1", qos=1)
    pub.publish("noalias/t", b"2", qos=1)
    for _ in range(2):
        p = sub.next_publish()
        assert p.topic == "noalias/t" and p.prop(r.TOPIC_ALIAS) is None


# -- message expiry -------------------------------------------------------------------------------


def test_message_expiry_decremented_while_queued(server):
    sub = Paho(server, "mexp", properties=props(CONNECT, SessionExpiryInterval=60))
    sub.subscribe("mexp/t", 1)
    sub.disconnect()
    pub = Paho(server, "mexp-pub")
    pub.publish("mexp/t", b"aging", qos=1, properties=props(PUBLISH, MessageExpiryInterval=10))
    time.sleep(2.0)
    sub = Paho(server, "mexp", clean_start=False,
               properties=props(CONNECT, SessionExpiryInterval=60))
    m = sub.get()
    assert m.payload == b"aging"
    left = prop(m.properties, "MessageExpiryInterval")
    assert left is not None, "Message Expiry Interval must be forwarded"
    assert 1 <= left <= 8, f"expected about 10 - 2 = 8 s left, got {left}"


def test_message_expiry_forwarded_live(server):
    sub = Paho(server, "live-exp")
    sub.subscribe("liveexp/t", 1)
    pub = Paho(server, "live-exp-pub")
    pub.publish("liveexp/t", b"x", qos=1, properties=props(PUBLISH, MessageExpiryInterval=100))
    pub.publish("liveexp/t", b"y", qos=1)
    a, b = sub.collect(2)
    assert prop(a.properties, "MessageExpiryInterval") in (99, 100)
    assert prop(b.properties, "MessageExpiryInterval") is None


def test_expired_messages_never_delivered(server):
    sub = Paho(server, "expd", properties=props(CONNECT, SessionExpiryInterval=60))
    sub.subscribe("expd/t", 1)
    sub.disconnect()
    pub = Paho(server, "expd-pub")
    pub.publish("expd/t", b"stale", qos=1, properties=props(PUBLISH, MessageExpiryInterval=1))
    pub.publish("expd/t", b"fresh", qos=1, properties=props(PUBLISH, MessageExpiryInterval=60))
    pub.publish("expd/t", b"timeless", qos=1)
    time.sleep(2.0)
    sub = Paho(server, "expd", clean_start=False,
               properties=props(CONNECT, SessionExpiryInterval=60))
    got = [m.payload for m in sub.drain(0.5)]
    assert got == [b"fresh", b"timeless"]


# -- payload format indicator ---------------------------------------------------------------------


@pytest.mark.parametrize("qos,ack_type", [(1, r.PUBACK), (2, r.PUBREC)])
def test_payload_format_invalid_utf8_refused(server, qos, ack_type):
    sub = Paho(server, "pfi-sub")
    sub.subscribe("pfi/#", 2)
    pub = raw_connected(server, "pfi-pub")
    pub.publish("pfi/bad", b"\xff\xfe not utf-8 \xc3\x28", qos=qos, packet_id=9,
                props=[(r.PAYLOAD_FORMAT_INDICATOR, 1)])
    ack = pub.expect(ack_type)
    assert (ack.packet_id, ack.reason) == (9, 0x99), f"expected reason 0x99, got {ack!r}"
    # The connection stays usable and a valid UTF-8 payload goes through with its indicator.
    pub.publish("pfi/good", "grüße ✓".encode(), qos=1, packet_id=10,
                props=[(r.PAYLOAD_FORMAT_INDICATOR, 1)])
    assert pub.expect(r.PUBACK).reason == 0
    m = sub.get()
    assert m.topic == "pfi/good" and m.payload == "grüße ✓".encode()
    assert prop(m.properties, "PayloadFormatIndicator") == 1
    sub.expect_nothing(0.2)


def test_payload_format_invalid_via_paho_on_publish_reason(server):
    Paho(server, "pfi-listener").subscribe("pfi2/t", 0)
    pub = Paho(server, "pfi-paho")
    rc = pub.publish("pfi2/t", b"\x80\x81", qos=1,
                     properties=props(PUBLISH, PayloadFormatIndicator=1))
    assert rc == 0x99


def test_binary_payload_without_indicator_accepted(server):
    sub = Paho(server, "bin-sub")
    sub.subscribe("bin/t", 1)
    pub = Paho(server, "bin-pub")
    assert pub.publish("bin/t", b"\xff\xfe\x00", qos=1,
                       properties=props(PUBLISH, PayloadFormatIndicator=0)) == 0
    assert sub.get().payload == b"\xff\xfe\x00"


# -- properties forwarded -------------------------------------------------------------------------

USER_PROPS = [("k", "v1"), ("z", "last?"), ("k", "v2"), ("k", "v1"), ("unicode", "ü✓"), ("e", "")]


def test_properties_forwarded_unchanged_paho(server):
    sub = Paho(server, "fwd-sub")
    sub.subscribe("fwd/t", 1)
    pub = Paho(server, "fwd-pub")
    p = props(PUBLISH, ContentType="text/plain; charset=utf-8", ResponseTopic="fwd/reply/1",
              CorrelationData=b"\x00\x01\x02\xff", UserProperty=USER_PROPS,
              PayloadFormatIndicator=1)
    pub.publish("fwd/t", b"hello", qos=1, properties=p)
    m = sub.get()
    q = m.properties
    assert prop(q, "ContentType") == "text/plain; charset=utf-8"
    assert prop(q, "ResponseTopic") == "fwd/reply/1"
    assert prop(q, "CorrelationData") == b"\x00\x01\x02\xff"
    assert prop(q, "UserProperty") == USER_PROPS, "user properties must keep order and duplicates"
    assert prop(q, "PayloadFormatIndicator") == 1


def test_properties_forwarded_unchanged_on_the_wire(server):
    sub = raw_connected(server, "fwd-raw-sub")
    sub.subscribe(1, [("fwdraw/t", 1)])
    pub = raw_connected(server, "fwd-raw-pub")
    sent = [(r.USER_PROPERTY, kv) for kv in USER_PROPS[:3]]
    sent += [(r.CONTENT_TYPE, "ct"), (r.RESPONSE_TOPIC, "a/b"), (r.CORRELATION_DATA, b"cd")]
    sent += [(r.USER_PROPERTY, kv) for kv in USER_PROPS[3:]]
    pub.publish("fwdraw/t", b"x", qos=1, packet_id=1, props=sent)
    assert pub.expect(r.PUBACK).reason == 0
    m = sub.next_publish()
    sub.send(r.ack(r.PUBACK, m.packet_id))
    assert m.prop_all(r.USER_PROPERTY) == USER_PROPS
    assert m.prop(r.CONTENT_TYPE) == "ct"
    assert m.prop(r.RESPONSE_TOPIC) == "a/b"
    assert m.prop(r.CORRELATION_DATA) == b"cd"


def test_v311_subscriber_gets_payload_only(server):
    sub = raw_connected(server, "old-sub", version=r.V311)
    sub.subscribe(1, [("old/t", 1)])
    pub = Paho(server, "new-pub")
    pub.publish("old/t", b"data", qos=1,
                properties=props(PUBLISH, ContentType="x", UserProperty=[("a", "b")]))
    m = sub.next_publish()
    assert (m.topic, m.payload, m.qos) == ("old/t", b"data", 1)
    sub.send(r.ack(r.PUBACK, m.packet_id, version=r.V311))


@pytest.mark.parametrize("response_topic", ["reply/#", "reply/+/x", "+"])
def test_response_topic_with_wildcard_is_protocol_error(server, response_topic):
    c = raw_connected(server, "bad-reply")
    c.publish("req/t", b"x", qos=1, packet_id=1, props=[(r.RESPONSE_TOPIC, response_topic)])
    d = c.expect_disconnect_and_close()
    assert d.reason == 0x82, f"expected DISCONNECT 0x82, got {d!r}"


# -- subscription identifiers ---------------------------------------------------------------------


def test_subscription_identifier_delivered(server):
    sub = Paho(server, "sid")
    assert sub.subscribe("sid/+", 1, properties=props(SUBSCRIBE, SubscriptionIdentifier=42)) == [1]
    assert sub.subscribe("other/t", 1) == [1]
    pub = Paho(server, "sid-pub")
    pub.publish("sid/a", b"1", qos=1)
    pub.publish("other/t", b"2", qos=1)
    a, b = sub.collect(2)
    assert prop(a.properties, "SubscriptionIdentifier") == [42]
    assert prop(b.properties, "SubscriptionIdentifier") is None


def test_overlapping_subscription_identifiers(server):
    sub = Paho(server, "sid2")
    sub.subscribe("ov/+", 1, properties=props(SUBSCRIBE, SubscriptionIdentifier=7))
    sub.subscribe("ov/#", 1, properties=props(SUBSCRIBE, SubscriptionIdentifier=268435455))
    pub = Paho(server, "sid2-pub")
    pub.publish("ov/x", b"both", qos=1)
    got = sub.drain(0.5)
    assert got, "no delivery"
    ids = [prop(m.properties, "SubscriptionIdentifier") for m in got]
    # One copy carrying both identifiers, or one copy per subscription with its own.
    if len(got) == 1:
        assert sorted(ids[0]) == [7, 268435455]
    else:
        assert len(got) == 2 and sorted(i for lst in ids for i in lst) == [7, 268435455]


def test_subscription_identifier_on_retained_delivery(server):
    pub = Paho(server, "sidr-pub")
    pub.publish("sidr/t", b"r", qos=1, retain=True)
    sub = Paho(server, "sidr")
    sub.subscribe("sidr/t", 1, properties=props(SUBSCRIBE, SubscriptionIdentifier=99))
    m = sub.get()
    assert m.retain is True and prop(m.properties, "SubscriptionIdentifier") == [99]


def test_publish_with_subscription_identifier_is_protocol_error(server):
    c = raw_connected(server, "sid-in-publish")
    c.publish("x/y", b"", qos=0, props=[(r.SUBSCRIPTION_IDENTIFIER, 3)])
    assert c.expect_disconnect_and_close().reason == 0x82



def test_outbound_topic_aliases_do_not_survive_reconnect(server):
    # Topic alias mappings belong to a network connection [MQTT-3.3.2-7]: after a reconnect
    # the broker must send the topic name again before using an alias.
    sub = raw_connected(server, "alias-resume", props=[(r.TOPIC_ALIAS_MAXIMUM, 3),
                                                      (r.SESSION_EXPIRY_INTERVAL, 60)])
    sub.subscribe(1, [("resume/t", 0)])
    pub = Paho(server, "alias-resume-pub")
    pub.publish("resume/t", b"1", qos=1)
    first = sub.next_publish()
    assert first.topic == "resume/t" and first.prop(r.TOPIC_ALIAS) is not None
    sub.disconnect()
    sub.wait_closed()
    again = raw_connected(server, "alias-resume", clean_start=False,
                          props=[(r.TOPIC_ALIAS_MAXIMUM, 3), (r.SESSION_EXPIRY_INTERVAL, 60)])
    pub.publish("resume/t", b"2", qos=1)
    p = again.next_publish()
    assert p.payload == b"2"
    assert p.topic == "resume/t", f"alias from the previous connection reused: {p!r}"
