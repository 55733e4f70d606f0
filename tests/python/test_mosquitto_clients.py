"""Interop with the Debian mosquitto-clients tools: mosquitto_pub, mosquitto_sub, mosquitto_rr."""

from __future__ import annotations

import itertools
import shutil
import time

import pytest

from helpers import V5, V311, PacketTypes, Paho, Proc, prop, props, run

pytestmark = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None,
    reason="mosquitto-clients not installed (apt-get install mosquitto-clients)",
)

PUBLISH = PacketTypes.PUBLISH
VERSIONS = {"mqttv5": V5, "mqttv311": V311}
FMT = "%t|%q|%r|%p"
_ids = itertools.count()


def base(server, version="mqttv5"):
    return ["-h", server.host, "-p", str(server.port), "-V", version]


def mosquitto_sub(server, topics, *, qos=0, version="mqttv5", fmt=FMT, extra=()):
    """Starts mosquitto_sub on `topics` and returns once it is known to be subscribed: a
    marker topic is subscribed too, and published to until the marker shows up."""
    marker = f"ready/{next(_ids)}"
    args = ["mosquitto_sub", *base(server, version), "-q", str(qos), "-F", fmt, *extra]
    for t in [*topics, marker]:
        args += ["-t", t]
    sub = Proc(args)
    poke = Paho(server, f"poke-{marker.replace('/', '-')}")
    deadline = time.monotonic() + 10
    while True:
        poke.publish(marker, b"ready", qos=0)
        try:
            sub.wait_line(lambda line: line.startswith(marker + "|"), timeout=0.2)
            break
        except AssertionError:
            if sub.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"mosquitto_sub never became ready:\n{sub.output()}")
    poke.disconnect()
    sub.start = len(sub.lines)
    return sub


def mosquitto_pub(server, topic, message, *, qos=0, version="mqttv5", extra=()):
    args = ["mosquitto_pub", *base(server, version), "-t", topic, "-q", str(qos), *extra]
    args += ["-n"] if message is None else ["-m", message]
    res = run(args)
    assert res.returncode == 0, f"mosquitto_pub failed ({res.returncode}): {res.stderr!r}"


def lines_for(sub: Proc, topic: str, n: int, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        with sub.cond:
            got = [ln for ln in sub.lines[sub.start:] if ln.startswith(topic + "|")]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_mosquitto_pub_to_mosquitto_sub(server, version, qos):
    sub = mosquitto_sub(server, ["mq/data"], qos=2, version=version)
    for i in range(3):
        mosquitto_pub(server, "mq/data", f"msg {i} q{qos}", qos=qos, version=version)
    got = lines_for(sub, "mq/data", 3)
    assert got == [f"mq/data|{qos}|0|msg {i} q{qos}" for i in range(3)]


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_mosquitto_pub_to_paho(server, version, qos):
    sub = Paho(server, "paho-sub", version=VERSIONS[version])
    assert sub.subscribe("mq/topaho", 2) == [2]
    mosquitto_pub(server, "mq/topaho", "from mosquitto", qos=qos, version=version)
    m = sub.get()
    assert (m.topic, m.payload, m.qos, m.retain) == ("mq/topaho", b"from mosquitto", qos, False)


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_paho_to_mosquitto_sub(server, version, qos):
    sub = mosquitto_sub(server, ["mq/frompaho"], qos=qos, version=version)
    pub = Paho(server, "paho-pub", version=VERSIONS[version])
    pub.publish("mq/frompaho", b"from paho", qos=2)
    assert lines_for(sub, "mq/frompaho", 1) == [f"mq/frompaho|{qos}|0|from paho"]


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_retained_with_mosquitto(server, version):
    mosquitto_pub(server, "mq/retained", "kept", qos=1, version=version, extra=["-r"])
    res = run(["mosquitto_sub", *base(server, version), "-t", "mq/retained", "-C", "1",
               "-W", "5", "-F", FMT])
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().strip() == "mq/retained|0|1|kept"
    # -R skips retained (stale) messages: a live one is printed without the retain flag.
    sub = mosquitto_sub(server, ["mq/retained"], qos=1, version=version, extra=["-R"])
    mosquitto_pub(server, "mq/retained", "live", qos=1, version=version)
    assert lines_for(sub, "mq/retained", 1) == ["mq/retained|1|0|live"]
    # A retained message with an empty payload (-n) clears it: the new retained value is gone
    # and nothing is delivered to the next subscriber.
    mosquitto_pub(server, "mq/retained", None, qos=1, version=version, extra=["-r"])
    late = Paho(server, "late", version=VERSIONS[version])
    late.subscribe("mq/retained", 1)
    late.expect_nothing(0.5)


def test_user_properties_from_mosquitto_pub(server):
    sub = Paho(server, "props-sub")
    sub.subscribe("mq/props", 1)
    mosquitto_pub(server, "mq/props", "with props", qos=1, extra=[
        "-D", "publish", "user-property", "k", "v",
        "-D", "publish", "user-property", "k", "v2",
        "-D", "publish", "user-property", "other", "x y",
        "-D", "publish", "content-type", "text/plain",
        "-D", "publish", "message-expiry-interval", "120",
    ])
    m = sub.get()
    assert m.payload == b"with props"
    assert prop(m.properties, "UserProperty") == [("k", "v"), ("k", "v2"), ("other", "x y")]
    assert prop(m.properties, "ContentType") == "text/plain"
    assert prop(m.properties, "MessageExpiryInterval") in (119, 120)


def test_user_properties_to_mosquitto_sub(server):
    sub = mosquitto_sub(server, ["mq/uprops"], qos=1, fmt="%t|%P|%p")
    pub = Paho(server, "uprops-pub")
    pub.publish("mq/uprops", b"hello", qos=1,
                properties=props(PUBLISH, UserProperty=[("a", "1"), ("b", "2"), ("a", "3")]))
    assert lines_for(sub, "mq/uprops", 1) == ["mq/uprops|a:1 b:2 a:3|hello"]


def test_mosquitto_sub_persistent_session(server):
    args = ["-i", "mq-persist", "-c", "-x", "300"]
    sub = mosquitto_sub(server, ["mq/persist"], qos=1, extra=args)
    sub.close()  # SIGTERM: mosquitto_sub disconnects; the session stays (expiry 300 s)
    mosquitto_pub(server, "mq/persist", "while offline", qos=1)
    res = run(["mosquitto_sub", *base(server), *args, "-t", "mq/persist", "-q", "1",
               "-C", "1", "-W", "5", "-F", FMT])
    assert res.returncode == 0, f"queued message not delivered: {res.stderr!r}"
    assert res.stdout.decode().strip() == "mq/persist|1|0|while offline"


def responder(server):
    """A paho client answering requests on `mq/rr/req`: it publishes `answer:<payload>` to the
    Response Topic, with the request's Correlation Data."""
    seen = []
    r = Paho(server, "responder")

    def on_message(client, userdata, msg):
        rt = prop(msg.properties, "ResponseTopic")
        cd = prop(msg.properties, "CorrelationData")
        seen.append((rt, cd))
        if rt:
            p = props(PUBLISH)
            if cd is not None:
                p.CorrelationData = cd
            client.publish(rt, b"answer:" + msg.payload, qos=1, properties=p)

    r.client.on_message = on_message
    assert r.subscribe("mq/rr/req", 1) == [1]
    return r, seen


@pytest.mark.parametrize("qos", [0, 1])
def test_mosquitto_rr_request_response(server, qos):
    _, seen = responder(server)
    res = run(["mosquitto_rr", *base(server), "-t", "mq/rr/req", "-e", "mq/rr/resp/1",
               "-m", "question", "-q", str(qos), "-W", "5",
               "-D", "publish", "correlation-data", "corr-42"])
    assert res.returncode == 0, f"mosquitto_rr failed ({res.returncode}): {res.stderr!r}"
    assert res.stdout.decode().strip() == "answer:question"
    assert seen == [("mq/rr/resp/1", b"corr-42")]


def test_mosquitto_rr_times_out_without_responder(server):
    res = run(["mosquitto_rr", *base(server), "-t", "mq/rr/nobody", "-e", "mq/rr/resp/2",
               "-m", "anyone?", "-W", "1"])
    assert res.returncode != 0
    assert res.stdout.decode().strip() == ""
