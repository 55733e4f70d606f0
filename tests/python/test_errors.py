"""Malformed input and protocol violations, sent byte by byte over raw sockets.

Every test ends by checking that a fresh, well-behaved client can still connect, subscribe,
publish and receive (the server stays up).
"""

from __future__ import annotations

import pytest

import mqttraw as r
from helpers import assert_healthy, raw, raw_connected


@pytest.fixture
def healthy_after(server):
    """The default server; after the test, a normal client must still work on it."""
    yield server
    assert_healthy(server)


def expect_disconnect(c: r.RawClient, code: int) -> None:
    d = c.expect_disconnect_and_close()
    assert d.reason == code, f"expected DISCONNECT {code:#x}, got {d!r}"


def assert_closed_without_connack(c: r.RawClient) -> None:
    data = c.wait_closed(5)
    assert not data or data[0] >> 4 != r.CONNACK, f"unexpected CONNACK: {data!r}"


def assert_closed_without_success(c: r.RawClient) -> bytes:
    """Closed; if anything was sent it is a refusing CONNACK, never a successful one."""
    data = c.wait_closed(5)
    if data:
        assert data[0] == 0x20, f"unexpected bytes: {data!r}"
        assert len(data) >= 4 and data[3] != 0, f"CONNACK accepted garbage: {data!r}"
    return data


# -- malformed packets ----------------------------------------------------------------------------


def test_bad_remaining_length(healthy_after):
    c = raw_connected(healthy_after, "bad-length")
    c.send(b"\x30\xff\xff\xff\xff\x7f")  # five-byte remaining length
    expect_disconnect(c, 0x81)


def test_qos3_publish(healthy_after):
    c = raw_connected(healthy_after, "qos3")
    body = r.string("a/b") + b"\x00\x01" + r.properties(None) + b"payload"
    c.send(r.packet(0x36, body))  # QoS bits 11
    expect_disconnect(c, 0x81)


def test_reserved_header_flags(healthy_after):
    c = raw_connected(healthy_after, "bad-flags")
    body = b"\x00\x01" + r.properties(None) + r.string("a/b") + b"\x00"
    c.send(r.packet(0x80, body))  # SUBSCRIBE must have flags 0010
    expect_disconnect(c, 0x81)


def test_pubrel_with_wrong_flags(healthy_after):
    c = raw_connected(healthy_after, "bad-pubrel")
    c.send(b"\x60\x02\x00\x01")  # PUBREL must have flags 0010
    expect_disconnect(c, 0x81)


def test_invalid_utf8_topic(healthy_after):
    c = raw_connected(healthy_after, "bad-utf8")
    c.send(r.packet(0x30, r.string(b"a/\xff\xfe") + r.properties(None) + b"x"))
    expect_disconnect(c, 0x81)


def test_null_character_in_topic(healthy_after):
    c = raw_connected(healthy_after, "nul-topic")
    c.send(r.packet(0x30, r.string(b"a/\x00/b") + r.properties(None) + b"x"))
    expect_disconnect(c, 0x81)


def test_truncated_body(healthy_after):
    c = raw_connected(healthy_after, "truncated")
    # Remaining length says 5; the topic length inside says 200.
    c.send(b"\x30\x05\x00\xc8abc")
    expect_disconnect(c, 0x81)


def test_unknown_property(healthy_after):
    c = raw_connected(healthy_after, "unknown-prop")
    c.send(r.packet(0x30, r.string("a/b") + b"\x02\x7f\x00" + b"x"))
    expect_disconnect(c, 0x81)


def test_subscribe_reserved_option_bits(healthy_after):
    c = raw_connected(healthy_after, "sub-reserved")
    c.send(r.subscribe(1, [("a/b", 0xC1)]))
    expect_disconnect(c, 0x81)


def test_subscribe_retain_handling_3(healthy_after):
    c = raw_connected(healthy_after, "sub-rh3")
    c.send(r.subscribe(1, [("a/b", 0x30 | 1)]))
    expect_disconnect(c, 0x82)


def test_subscribe_without_filters(healthy_after):
    c = raw_connected(healthy_after, "sub-empty")
    c.send(r.packet(0x82, b"\x00\x01" + r.properties(None)))
    expect_disconnect(c, 0x82)


def test_duplicate_property(healthy_after):
    c = raw_connected(healthy_after, "dup-prop")
    c.publish("a/b", b"x", props=[(r.CONTENT_TYPE, "a"), (r.CONTENT_TYPE, "b")])
    expect_disconnect(c, 0x82)


def test_malformed_v311_closes_without_disconnect(healthy_after):
    c = raw_connected(healthy_after, "bad311", version=r.V311)
    c.send(b"\x36\x05\x00\x01a\x00\x01")
    assert c.wait_closed(5) == b"", "3.1.1 has no server DISCONNECT"


def test_will_qos_3(healthy_after):
    c = raw(healthy_after)
    c.send(r.connect("will-q3", will=r.Will("w/t", b"x", qos=3)))
    assert_closed_without_success(c)


def test_will_qos_without_will_flag(healthy_after):
    c = raw(healthy_after)
    c.send(r.connect("will-flags", flags_override=0x02 | 0x08))  # clean start + will QoS 1
    assert_closed_without_success(c)


# -- protocol errors ------------------------------------------------------------------------------


def test_subscription_identifier_zero(healthy_after):
    c = raw_connected(healthy_after, "sid-zero")
    c.send(r.subscribe(1, [("a/b", 0)], props=[(r.SUBSCRIPTION_IDENTIFIER, 0)]))
    expect_disconnect(c, 0x82)


def test_ack_for_unknown_packet_id_is_harmless(healthy_after):
    c = raw_connected(healthy_after, "stray-acks")
    c.send(r.ack(r.PUBACK, 999))
    c.send(r.ack(r.PUBCOMP, 998))
    c.send(r.pingreq())
    assert c.expect(r.PINGRESP).type == r.PINGRESP
    c.send(r.ack(r.PUBREL, 997))  # answered with PUBCOMP 0x92, connection stays
    comp = c.expect(r.PUBCOMP)
    assert (comp.packet_id, comp.reason) == (997, 0x92)
    c.send(r.pingreq())
    assert c.expect(r.PINGRESP).type == r.PINGRESP


def test_second_connect(healthy_after):
    c = raw_connected(healthy_after, "twice")
    c.send(r.connect("twice"))
    expect_disconnect(c, 0x82)


def test_auth_without_authentication_method(healthy_after):
    c = raw_connected(healthy_after, "auth-packet")
    c.send(r.packet(0xF0, b"\x18\x00"))  # AUTH, Continue authentication
    expect_disconnect(c, 0x82)


def test_server_to_client_packet_from_client(healthy_after):
    c = raw_connected(healthy_after, "wrong-direction")
    c.send(b"\xd0\x00")  # PINGRESP
    expect_disconnect(c, 0x82)


def test_packet_too_large(mqkv):
    s = mqkv("--max-packet-size", "1024")
    c = raw_connected(s, "big")
    assert c.connack.prop(r.MAXIMUM_PACKET_SIZE) == 1024
    c.publish("big/t", b"x" * 2048, qos=0)
    expect_disconnect(c, 0x95)
    # Just under the limit is fine.
    ok = raw_connected(s, "fits")
    ok.publish("big/t", b"x" * 900, qos=1, packet_id=1)
    assert ok.expect(r.PUBACK).packet_id == 1
    assert_healthy(s)


def test_declared_length_above_limit_without_body(mqkv):
    s = mqkv("--max-packet-size", "1024")
    c = raw_connected(s, "liar")
    c.send(b"\x30" + r.varint(200_000_000))  # never sends the body
    expect_disconnect(c, 0x95)
    assert_healthy(s)


@pytest.mark.parametrize("alias", [0, 5, 65535])
def test_topic_alias_invalid(mqkv, alias):
    s = mqkv("--topic-alias-maximum", "4")
    c = raw_connected(s, "alias-bad")
    assert c.connack.prop(r.TOPIC_ALIAS_MAXIMUM) == 4
    c.publish("alias/t", b"x", props=[(r.TOPIC_ALIAS, alias)])
    expect_disconnect(c, 0x94)
    assert_healthy(s)


def test_topic_alias_unknown_with_empty_topic(healthy_after):
    c = raw_connected(healthy_after, "alias-unknown")
    c.publish("", b"x", props=[(r.TOPIC_ALIAS, 3)])
    expect_disconnect(c, 0x82)


def test_topic_alias_when_server_allows_none(mqkv):
    s = mqkv("--topic-alias-maximum", "0")
    c = raw_connected(s, "alias-none")
    assert c.connack.prop(r.TOPIC_ALIAS_MAXIMUM, 0) == 0
    c.publish("t", b"x", props=[(r.TOPIC_ALIAS, 1)])
    expect_disconnect(c, 0x94)
    assert_healthy(s)


def test_empty_topic_without_alias(healthy_after):
    c = raw_connected(healthy_after, "no-topic")
    c.publish("", b"x")
    expect_disconnect(c, 0x82)


@pytest.mark.parametrize("topic", ["a/+", "a/#", "#", "+/b", "a/b+"])
def test_publish_to_wildcard_topic(healthy_after, topic):
    c = raw_connected(healthy_after, "wild-pub")
    c.publish(topic, b"x", qos=1, packet_id=1)
    expect_disconnect(c, 0x90)


def test_qos0_invalid_payload_format(healthy_after):
    c = raw_connected(healthy_after, "pfi0")
    c.publish("pfi/t", b"\xff", props=[(r.PAYLOAD_FORMAT_INDICATOR, 1)])
    # MQTT 5 3.3.2.3.2: DISCONNECT 0x99 is a valid reaction for QoS 0 (no ack exists).
    expect_disconnect(c, 0x99)


# -- before CONNECT -------------------------------------------------------------------------------


@pytest.mark.parametrize("first", [
    pytest.param(b"\xc0\x00", id="pingreq"),
    pytest.param(r.publish("a/b", b"x", version=r.V311), id="publish"),
    pytest.param(r.subscribe(1, [("a", 0)], version=r.V311), id="subscribe"),
    pytest.param(b"\xe0\x00", id="disconnect"),
])
def test_first_packet_not_connect(healthy_after, first):
    c = raw(healthy_after)
    c.send(first)
    assert_closed_without_connack(c)


@pytest.mark.parametrize("junk", [
    # 'G' reads as a header byte with remaining length 'E' (69): send at least that much, as
    # a broker may wait for the whole "packet" (up to its CONNECT timeout) before judging it.
    pytest.param(b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: interop-test\r\n"
                 b"Accept: */*\r\nConnection: keep-alive\r\n\r\n", id="http"),
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64, id="tls-hello"),
    pytest.param(bytes(range(256)) * 4, id="bytes"),
    pytest.param(b"\x10\xff\xff\xff\xff\xff", id="connect-bad-length"),
    pytest.param(b"\x10\x03\x00\x04MQ", id="connect-truncated"),
])
def test_garbage_bytes(healthy_after, junk):
    c = raw(healthy_after)
    c.send(junk)
    assert_closed_without_success(c)


def test_connection_closed_mid_connect(healthy_after):
    c = raw(healthy_after)
    c.send(r.connect("half")[:7])
    c.close()


def test_connect_reserved_flag(healthy_after):
    c = raw(healthy_after)
    c.send(r.connect("reserved", flags_override=0x03))  # bit 0 is reserved
    assert_closed_without_success(c)


def test_unsupported_protocol_level_3_mqisdp(healthy_after):
    c = raw(healthy_after, r.V311)
    c.send(r.connect("old", version=3, protocol_name=b"MQIsdp"))
    ack = c.expect(r.CONNACK)
    assert ack.reason == 0x01, f"expected return code 1 (unacceptable protocol), got {ack!r}"
    assert ack.body == b"\x00\x01"
    c.wait_closed()


def test_unsupported_protocol_level_6(healthy_after):
    c = raw(healthy_after)
    c.send(r.connect("future", version=6))
    data = c.wait_closed(5)
    if data:  # a CONNACK is optional; if sent it must refuse
        assert data[0] == 0x20 and data[3] in (0x01, 0x84), f"got {data!r}"


def test_wrong_protocol_name(healthy_after):
    c = raw(healthy_after)
    c.send(r.connect("notmqtt", protocol_name=b"MQTX"))
    assert_closed_without_success(c)


def test_many_bad_clients_in_a_row(healthy_after):
    for i in range(20):
        c = raw(healthy_after)
        c.send(bytes([i * 13 % 256]) * 50)
        c.close()
    for i in range(10):
        c = raw_connected(healthy_after, f"bad-{i}")
        c.send(b"\x36\x00")
        c.close()


# -- announced but unsent packets -----------------------------------------------------------------


def rss_bytes(server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memory_follows_the_bytes_that_arrived_not_the_length_announced(mqkv):
    """Connections that announce a 15 MiB PUBLISH and send 1 KB make the server hold about what
    arrived, not what was announced."""
    s = mqkv()
    before = rss_bytes(s)
    announced = 15 * 1024 * 1024
    clients = []
    for i in range(60):
        c = raw_connected(s, f"announcer-{i}")
        body = r.string("big/topic") + b"\x00" + b"x" * 1000
        header = bytes([0x30]) + r.varint(announced)
        c.send(header + body)
        clients.append(c)
    # Every connection has read its kilobyte: the server answers a ping on a fresh one.
    probe = raw_connected(s, "probe")
    probe.send(r.pingreq())
    assert probe.expect(r.PINGRESP).type == r.PINGRESP
    grown = rss_bytes(s) - before
    assert grown < 40 * 1024 * 1024, f"resident memory grew {grown / 2**20:.1f} MiB for 60 KB sent"
    assert_healthy(s)


def test_a_packet_that_stops_arriving_midway_is_timed_out(mqkv):
    """Keep alive 0 and half a packet: the connection is closed with DISCONNECT 0x8D once
    --packet-timeout-secs has passed, and the server goes on."""
    s = mqkv("--packet-timeout-secs", "1")
    c = raw_connected(s, "stalls", keep_alive=0)
    c.send(bytes([0x30]) + r.varint(100) + b"half")
    d = c.expect_disconnect_and_close(timeout=20)
    assert d.reason == 0x8D, f"expected DISCONNECT 0x8D, got {d!r}"
    # A client that sends whole packets slowly is not affected.
    slow = raw_connected(s, "slow-but-whole", keep_alive=0)
    for _ in range(3):
        slow.send(r.pingreq())
        assert slow.expect(r.PINGRESP).type == r.PINGRESP
    assert_healthy(s)


# -- limits on what clients can make the server keep ----------------------------------------------


def test_retained_messages_beyond_the_limit_are_refused_with_0x97(mqkv):
    s = mqkv("--max-retained-messages", "3", "--max-retained-bytes", "200")
    c = raw_connected(s, "retainer")
    acks = []
    for i, topic in enumerate(["keep/1", "keep/2", "keep/3", "keep/4"]):
        c.publish(topic, b"v", qos=1, retain=True, packet_id=i + 1)
        acks.append(c.expect(r.PUBACK).reason)
    assert acks[:3] == [0x10] * 3 and acks[3] == 0x97, acks
    # Replacing one that is kept still works; clearing one makes room.
    c.publish("keep/1", b"w", qos=1, retain=True, packet_id=5)
    assert c.expect(r.PUBACK).reason == 0x10
    c.publish("keep/2", b"", qos=1, retain=True, packet_id=6)
    assert c.expect(r.PUBACK).reason == 0x10
    c.publish("keep/4", b"v", qos=1, retain=True, packet_id=7)
    assert c.expect(r.PUBACK).reason == 0x10
    # Bytes: a payload that would pass 200 bytes in all is refused too, at QoS 2 with PUBREC.
    c.publish("keep/5", b"x" * 300, qos=2, retain=True, packet_id=8)
    assert c.expect(r.PUBREC).reason == 0x97
    # The refused messages were not kept (nor published); the connection goes on.
    sub = raw_connected(s, "reader")
    sub.subscribe(1, [("keep/#", 1)])
    got = {p.topic for p in [sub.next_publish(), sub.next_publish(), sub.next_publish()]}
    assert got == {"keep/1", "keep/3", "keep/4"}
    c.send(r.pingreq())
    assert c.expect(r.PINGRESP).type == r.PINGRESP
    assert_healthy(s)


def test_sessions_beyond_the_limit_get_connack_0x97(mqkv):
    s = mqkv("--max-sessions", "2")
    first = raw_connected(s, "one")
    raw_connected(s, "two")
    third = raw(s)
    ack = third.connect("three")
    assert ack.reason == 0x97, f"CONNACK {ack!r}"
    # A client with a session may still connect again (taking it over).
    again = raw(s)
    assert again.connect("one").reason == 0
    first.wait_closed(5)
