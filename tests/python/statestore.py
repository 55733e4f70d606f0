"""A small state store client over paho-mqtt, speaking the AIO protocol (RESP3 over MQTT 5)."""

from __future__ import annotations

import time
import uuid

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

REQUEST_TOPIC = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"
NOTIFY_PREFIX = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/"


def resp3(*args: bytes | str) -> bytes:
    """A RESP3 array of blob strings."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def notify_filter(client_id: str) -> str:
    """The filter of every notification to `client_id`."""
    return f"{NOTIFY_PREFIX}{client_id.encode().hex().upper()}/command/notify/#"


def notify_topic(client_id: str, key: bytes) -> str:
    return f"{NOTIFY_PREFIX}{client_id.encode().hex().upper()}/command/notify/{key.hex().upper()}"


class StoreClient:
    """Requests through a connected `helpers.Paho` client; answers are read from its response
    topic, which it subscribes to."""

    def __init__(self, paho, client_id: str, response_topic: str | None = None):
        self.paho = paho
        self.client_id = client_id
        self.response_topic = response_topic or f"clients/{client_id}/statestore/response"
        self.suback = paho.subscribe(self.response_topic, qos=1)
        self.others = []
        # The latest response message, for its properties.
        self.last = None

    def request(self, *args: bytes | str, timeout: float = 5.0) -> bytes:
        """Sends one request and returns the response payload (RESP3)."""
        corr = uuid.uuid4().bytes
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.response_topic
        props.CorrelationData = corr
        props.UserProperty = [("__ts", f"{int(time.time() * 1000)}:0:py"), ("__protVer", "1.0")]
        props.MessageExpiryInterval = 10
        rc = self.paho.publish(REQUEST_TOPIC, resp3(*args), qos=1, properties=props)
        assert rc in (0, 16), f"request publish refused with {rc:#x}"
        deadline = time.monotonic() + timeout
        while True:
            m = self.paho.get(timeout=max(0.01, deadline - time.monotonic()))
            if m.topic == self.response_topic and m.properties.CorrelationData == corr:
                self.last = m
                return m.payload
            self.others.append(m)

    def set(self, key, value) -> bytes:
        return self.request("SET", key, value)

    def get(self, key) -> bytes:
        return self.request("GET", key)

    def scan_all(self, pattern: str) -> list[bytes]:
        """Every key SCAN lists for `pattern`, following continuation tokens."""
        keys, token = [], None
        for _ in range(1000):
            answer = self.request("SCAN", pattern, *([token] if token else []))
            page, token = parse_scan(answer)
            keys += page
            if token is None:
                return keys
        raise AssertionError("SCAN did not finish")


def parse_scan(answer: bytes) -> tuple[list[bytes], bytes | None]:
    """A SCAN answer, `*2 *N key... token` or `*1 *N key...`, as (keys, token)."""
    lines = answer.split(b"\r\n")
    assert lines[0] in (b"*1", b"*2"), answer
    n = int(lines[1][1:])
    keys = [lines[3 + 2 * i] for i in range(n)]
    token = lines[3 + 2 * n] if lines[0] == b"*2" else None
    return keys, token
