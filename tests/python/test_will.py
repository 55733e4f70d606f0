"""Will messages: delay, normal vs abnormal disconnects, network loss, resumption, properties."""

from __future__ import annotations

import queue
import time

import mqttraw as r
from helpers import V311, PacketTypes, Paho, Proc, prop, props, raw, raw_connected

CONNECT = PacketTypes.CONNECT
WILL = PacketTypes.WILLMESSAGE


def watcher(server, topic="will/#", qos=1) -> Paho:
    w = Paho(server, f"watch-{topic.replace('/', '_').replace('#', 'all')}")
    assert w.subscribe(topic, qos) == [qos]
    return w


def expect_will_promptly(w: Paho, since: float, limit: float = 2.0):
    """The will must arrive within `limit` seconds of the connection loss at `since`. Waits a
    little longer on failure so the report can say when (and whether) it came at all."""
    try:
        m = w.messages.get(timeout=limit + 6)
    except queue.Empty:
        raise AssertionError(f"no will within {limit + 6:.0f}s of the network loss") from None
    took = time.monotonic() - since
    assert took <= limit, (
        f"will published {took:.2f}s after the network connection was lost "
        f"(Will Delay Interval 0: expected at once, allowed {limit}s)"
    )
    return m


def test_will_delay_interval(server):
    w = watcher(server)
    c = raw_connected(
        server, "delayed", props=[(r.SESSION_EXPIRY_INTERVAL, 60)],
        will=r.Will("will/delayed", b"late", qos=1, props=[(r.WILL_DELAY_INTERVAL, 2)]),
    )
    c.disconnect(0x04)  # Disconnect with Will Message: the will is due after its delay.
    gone = time.monotonic()
    w.expect_nothing(1.5)
    m = w.get(3.0)
    elapsed = time.monotonic() - gone
    assert (m.topic, m.payload) == ("will/delayed", b"late")
    assert elapsed >= 1.9, f"will published {elapsed:.2f}s after disconnect, delay was 2s"
    w.expect_nothing(0.3)


def test_will_delay_bounded_by_session_expiry(server):
    # The will is published when the session ends, if that comes before the delay.
    w = watcher(server)
    c = raw_connected(
        server, "short-session", props=[(r.SESSION_EXPIRY_INTERVAL, 1)],
        will=r.Will("will/session-end", b"session over", props=[(r.WILL_DELAY_INTERVAL, 30)]),
    )
    c.disconnect(0x04)
    m = w.get(4.0)
    assert m.payload == b"session over"


def test_will_delay_with_session_expiry_zero_is_immediate(server):
    # The session ends when the connection closes, so the will goes out then.
    w = watcher(server)
    c = raw_connected(server, "no-session",
                      will=r.Will("will/now", b"now", props=[(r.WILL_DELAY_INTERVAL, 10)]))
    c.disconnect(0x04)
    assert w.get(1.5).payload == b"now"


def test_no_will_on_normal_disconnect(server):
    w = watcher(server)
    c = Paho(server, "polite", will=dict(topic="will/polite", payload=b"should not"))
    c.disconnect(0x00)
    w.expect_nothing(1.0)


def test_no_will_on_normal_disconnect_v311(server):
    w = watcher(server)
    c = Paho(server, "polite311", version=V311,
             will=dict(topic="will/polite311", payload=b"should not"))
    c.disconnect()
    w.expect_nothing(1.0)


def test_will_on_disconnect_with_will_message(server):
    w = watcher(server)
    c = Paho(server, "leaver", will=dict(topic="will/leaver", payload=b"bye", qos=1))
    c.disconnect(0x04)
    m = w.get(2.0)
    assert (m.topic, m.payload, m.qos) == ("will/leaver", b"bye", 1)


def test_will_on_network_loss_fin(server):
    w = watcher(server)
    c = raw_connected(server, "lost-fin", will=r.Will("will/fin", b"connection lost"))
    c.close()
    m = expect_will_promptly(w, time.monotonic())
    assert (m.topic, m.payload) == ("will/fin", b"connection lost")


def test_will_on_network_loss_reset(server):
    w = watcher(server)
    c = raw_connected(server, "lost-rst", will=r.Will("will/rst", b"reset", qos=1))
    c.abort()
    m = expect_will_promptly(w, time.monotonic())
    assert (m.topic, m.payload) == ("will/rst", b"reset")


def test_will_on_network_loss_v311(server):
    w = watcher(server)
    c = raw_connected(server, "lost311", version=r.V311,
                      will=r.Will("will/v311", b"gone", qos=1, retain=False))
    c.close()
    m = expect_will_promptly(w, time.monotonic())
    assert (m.topic, m.payload, m.qos) == ("will/v311", b"gone", 1)


def test_will_when_client_process_killed(server):
    w = watcher(server)
    sub = Proc(["mosquitto_sub", "-h", server.host, "-p", str(server.port), "-V", "mqttv5",
                "-i", "doomed", "-t", "doomed/in", "-d",
                "--will-topic", "will/killed", "--will-payload", "killed", "--will-qos", "1"])
    sub.wait_line("SUBACK")
    sub.kill()
    m = expect_will_promptly(w, time.monotonic())
    assert (m.topic, m.payload) == ("will/killed", b"killed")


def test_will_cancelled_when_session_resumes_within_delay(server):
    w = watcher(server)
    will = r.Will("will/resumed", b"must not appear", props=[(r.WILL_DELAY_INTERVAL, 2)])
    c = raw_connected(server, "comeback", props=[(r.SESSION_EXPIRY_INTERVAL, 60)], will=will)
    c.disconnect(0x04)
    c.wait_closed()
    again = raw(server).connect("comeback", clean_start=False,
                                props=[(r.SESSION_EXPIRY_INTERVAL, 60)])
    assert again.reason == 0 and again.session_present is True
    w.expect_nothing(3.0)


def test_will_cancelled_when_session_resumes_after_network_loss(server):
    w = watcher(server)
    will = r.Will("will/resumed2", b"must not appear", props=[(r.WILL_DELAY_INTERVAL, 2)])
    c = raw_connected(server, "comeback2", props=[(r.SESSION_EXPIRY_INTERVAL, 60)], will=will)
    c.close()
    time.sleep(0.2)
    again = Paho(server, "comeback2", clean_start=False,
                 properties=props(CONNECT, SessionExpiryInterval=60))
    assert again.session_present is True
    w.expect_nothing(3.0)


def test_will_on_takeover_without_delay(server):
    w = watcher(server)
    raw_connected(server, "taken", will=r.Will("will/taken", b"taken over"))
    raw_connected(server, "taken")
    m = w.get(2.0)
    assert m.payload == b"taken over"


def test_will_properties_forwarded(server):
    w = watcher(server)
    user = [("origin", "will"), ("k", "1"), ("origin", "again")]
    wp = props(WILL, ContentType="application/json", UserProperty=user,
               MessageExpiryInterval=60, PayloadFormatIndicator=1,
               ResponseTopic="will/reply", CorrelationData=b"\x00\x01corr")
    c = Paho(server, "propwill", will=dict(topic="will/props", payload=b'{"state":"gone"}',
                                           qos=1, properties=wp))
    c.disconnect(0x04)
    m = w.get(2.0)
    assert m.payload == b'{"state":"gone"}'
    p = m.properties
    assert prop(p, "ContentType") == "application/json"
    assert prop(p, "UserProperty") == user
    assert prop(p, "PayloadFormatIndicator") == 1
    assert prop(p, "ResponseTopic") == "will/reply"
    assert prop(p, "CorrelationData") == b"\x00\x01corr"
    expiry = prop(p, "MessageExpiryInterval")
    assert expiry is not None and 0 < expiry <= 60, f"Message Expiry Interval {expiry!r}"
    assert prop(p, "WillDelayInterval") is None


def test_retained_will(server):
    w = watcher(server, "will/retained")
    c = Paho(server, "retwill", will=dict(topic="will/retained", payload=b"last words",
                                          retain=True))
    c.disconnect(0x04)
    # To a subscriber already there the will goes out live, without the retain flag; by then
    # it is stored as the topic's retained message.
    m = w.get(2.0)
    assert (m.payload, m.retain) == (b"last words", False)
    # A subscriber arriving later gets the will as a retained message.
    late = Paho(server, "late")
    assert late.subscribe("will/retained", 1) == [1]
    m = late.get(2.0)
    assert (m.payload, m.retain) == (b"last words", True)
