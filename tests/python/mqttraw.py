"""A tiny hand-rolled MQTT 5 / 3.1.1 packet encoder and decoder for raw-socket tests.

Nothing here is clever on purpose: the tests build exactly the bytes they mean to send
(including malformed ones) and read back exactly what the broker wrote.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

# Packet types.
CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

PACKET_NAMES = {
    1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL",
    7: "PUBCOMP", 8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK",
    12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH",
}

V311 = 4
V5 = 5

# Property identifiers (MQTT 5, section 2.2.2.2).
PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)
PROPERTY_TYPES = {
    PAYLOAD_FORMAT_INDICATOR: _BYTE,
    MESSAGE_EXPIRY_INTERVAL: _U32,
    CONTENT_TYPE: _STR,
    RESPONSE_TOPIC: _STR,
    CORRELATION_DATA: _BIN,
    SUBSCRIPTION_IDENTIFIER: _VARINT,
    SESSION_EXPIRY_INTERVAL: _U32,
    ASSIGNED_CLIENT_IDENTIFIER: _STR,
    SERVER_KEEP_ALIVE: _U16,
    AUTHENTICATION_METHOD: _STR,
    AUTHENTICATION_DATA: _BIN,
    REQUEST_PROBLEM_INFORMATION: _BYTE,
    WILL_DELAY_INTERVAL: _U32,
    REQUEST_RESPONSE_INFORMATION: _BYTE,
    RESPONSE_INFORMATION: _STR,
    SERVER_REFERENCE: _STR,
    REASON_STRING: _STR,
    RECEIVE_MAXIMUM: _U16,
    TOPIC_ALIAS_MAXIMUM: _U16,
    TOPIC_ALIAS: _U16,
    MAXIMUM_QOS: _BYTE,
    RETAIN_AVAILABLE: _BYTE,
    USER_PROPERTY: _PAIR,
    MAXIMUM_PACKET_SIZE: _U32,
    WILDCARD_SUBSCRIPTION_AVAILABLE: _BYTE,
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: _BYTE,
    SHARED_SUBSCRIPTION_AVAILABLE: _BYTE,
}


class ProtocolError(Exception):
    """The bytes the broker sent do not parse."""


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


binary = string


def properties(props: list[tuple[int, object]] | None) -> bytes:
    """Encodes a property list, given as (identifier, value) pairs in wire order."""
    body = bytearray()
    for pid, value in props or []:
        kind = PROPERTY_TYPES[pid]
        body += varint(pid)
        if kind == _BYTE:
            body.append(value)
        elif kind == _U16:
            body += struct.pack("!H", value)
        elif kind == _U32:
            body += struct.pack("!I", value)
        elif kind == _VARINT:
            body += varint(value)
        elif kind in (_STR, _BIN):
            body += string(value)
        else:
            k, v = value
            body += string(k) + string(v)
    return varint(len(body)) + bytes(body)


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + varint(len(body)) + body


@dataclass
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    props: list = field(default_factory=list)


def connect(
    client_id: str = "",
    *,
    version: int = V5,
    keep_alive: int = 60,
    clean_start: bool = True,
    props: list | None = None,
    will: Will | None = None,
    username: str | None = None,
    password: bytes | str | None = None,
    protocol_name: bytes = b"MQTT",
    flags_override: int | None = None,
) -> bytes:
    flags = 0
    if clean_start:
        flags |= 0x02
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if password is not None:
        flags |= 0x40
    if username is not None:
        flags |= 0x80
    if flags_override is not None:
        flags = flags_override
    body = string(protocol_name) + bytes([version, flags]) + struct.pack("!H", keep_alive)
    if version == V5:
        body += properties(props)
    body += string(client_id)
    if will is not None:
        if version == V5:
            body += properties(will.props)
        body += string(will.topic) + binary(will.payload)
    if username is not None:
        body += string(username)
    if password is not None:
        body += binary(password)
    return packet(0x10, body)


def publish(
    topic: str,
    payload: bytes = b"",
    *,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int = 1,
    props: list | None = None,
    version: int = V5,
) -> bytes:
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    body = string(topic)
    if qos > 0:
        body += struct.pack("!H", packet_id)
    if version == V5:
        body += properties(props)
    body += payload
    return packet(first, body)


def ack(kind: int, packet_id: int, reason: int | None = None, version: int = V5) -> bytes:
    """PUBACK / PUBREC / PUBREL / PUBCOMP."""
    first = (kind << 4) | (0x02 if kind == PUBREL else 0)
    body = struct.pack("!H", packet_id)
    if version == V5 and reason is not None:
        body += bytes([reason])
    return packet(first, body)


def subscribe(
    packet_id: int,
    filters: list[tuple[str, int]],
    *,
    props: list | None = None,
    version: int = V5,
) -> bytes:
    """`filters` pairs a filter with its options byte (QoS in bits 0-1, no local 0x04,
    retain as published 0x08, retain handling in bits 4-5)."""
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += properties(props)
    for f, opts in filters:
        body += string(f) + bytes([opts])
    return packet(0x82, body)


def unsubscribe(packet_id: int, filters: list[str], *, version: int = V5) -> bytes:
    body = struct.pack("!H", packet_id)
    if version == V5:
        body += properties(None)
    for f in filters:
        body += string(f)
    return packet(0xA2, body)


def auth(reason: int, props: list | None = None) -> bytes:
    """AUTH (MQTT 5 only)."""
    return packet(AUTH << 4, bytes([reason]) + properties(props))


def pingreq() -> bytes:
    return b"\xc0\x00"


def disconnect(reason: int = 0, props: list | None = None, version: int = V5) -> bytes:
    if version != V5:
        return b"\xe0\x00"
    return packet(0xE0, bytes([reason]) + properties(props))


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


@dataclass
class Packet:
    type: int
    flags: int
    body: bytes
    # Decoded fields; which ones are set depends on the type.
    reason: int | None = None
    session_present: bool | None = None
    packet_id: int | None = None
    topic: str | None = None
    payload: bytes | None = None
    qos: int | None = None
    retain: bool | None = None
    dup: bool | None = None
    reasons: list[int] | None = None
    props: list[tuple[int, object]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return PACKET_NAMES.get(self.type, f"type {self.type}")

    def prop(self, pid: int, default=None):
        """The first value of a property."""
        for k, v in self.props:
            if k == pid:
                return v
        return default

    def prop_all(self, pid: int) -> list:
        return [v for k, v in self.props if k == pid]

    def __repr__(self) -> str:
        fields = [self.name]
        for k in ("reason", "session_present", "packet_id", "topic", "payload", "qos", "retain",
                  "dup", "reasons"):
            v = getattr(self, k)
            if v is not None:
                if k == "reason":
                    v = hex(v)
                fields.append(f"{k}={v!r}")
        if self.props:
            fields.append(f"props={self.props!r}")
        return "<" + " ".join(fields) + ">"


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if self.left() < n:
            raise ProtocolError(f"need {n} bytes, have {self.left()}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("!H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("!I", self.take(4))[0]

    def varint(self) -> int:
        value, shift = 0, 0
        for _ in range(4):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise ProtocolError("variable byte integer longer than 4 bytes")

    def bin(self) -> bytes:
        return self.take(self.u16())

    def str(self) -> str:
        return self.bin().decode("utf-8")

    def props(self) -> list:
        end = self.varint() + self.pos
        out = []
        while self.pos < end:
            pid = self.varint()
            kind = PROPERTY_TYPES.get(pid)
            if kind is None:
                raise ProtocolError(f"unknown property id {pid:#x}")
            if kind == _BYTE:
                v = self.byte()
            elif kind == _U16:
                v = self.u16()
            elif kind == _U32:
                v = self.u32()
            elif kind == _VARINT:
                v = self.varint()
            elif kind == _STR:
                v = self.str()
            elif kind == _BIN:
                v = self.bin()
            else:
                v = (self.str(), self.str())
            out.append((pid, v))
        if self.pos != end:
            raise ProtocolError("property length mismatch")
        return out


def decode(first: int, body: bytes, version: int = V5) -> Packet:
    kind, flags = first >> 4, first & 0x0F
    p = Packet(kind, flags, body)
    r = _Reader(body)
    v5 = version == V5
    if kind == CONNACK:
        p.session_present = bool(r.byte() & 0x01)
        p.reason = r.byte()
        if v5 and r.left():
            p.props = r.props()
    elif kind == PUBLISH:
        p.qos = (flags >> 1) & 0x03
        p.retain = bool(flags & 0x01)
        p.dup = bool(flags & 0x08)
        p.topic = r.str()
        if p.qos:
            p.packet_id = r.u16()
        if v5:
            p.props = r.props()
        p.payload = r.take(r.left())
    elif kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        p.packet_id = r.u16()
        p.reason = 0
        if v5 and r.left():
            p.reason = r.byte()
            if r.left():
                p.props = r.props()
    elif kind in (SUBACK, UNSUBACK):
        p.packet_id = r.u16()
        if v5:
            p.props = r.props()
        p.reasons = list(r.take(r.left()))
    elif kind == DISCONNECT:
        p.reason = 0
        if r.left():
            p.reason = r.byte()
            if r.left():
                p.props = r.props()
    elif kind == AUTH:
        p.reason = 0
        if r.left():
            p.reason = r.byte()
            if r.left():
                p.props = r.props()
    return p


class Closed(Exception):
    """The broker closed the connection."""


class RawClient:
    """A blocking TCP connection speaking MQTT byte by byte."""

    def __init__(self, host: str, port: int, *, version: int = V5, rcvbuf: int | None = None,
                 timeout: float = 5.0):
        self.version = version
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    # -- sending -------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str = "", **kw) -> Packet:
        """Sends CONNECT and returns the CONNACK."""
        kw.setdefault("version", self.version)
        self.send(connect(client_id, **kw))
        return self.expect(CONNACK)

    def publish(self, topic: str, payload: bytes = b"", **kw) -> None:
        kw.setdefault("version", self.version)
        self.send(publish(topic, payload, **kw))

    def subscribe(self, packet_id: int, filters, **kw) -> Packet:
        """Sends SUBSCRIBE and returns the SUBACK (publishes read meanwhile are kept)."""
        kw.setdefault("version", self.version)
        self.send(subscribe(packet_id, filters, **kw))
        return self.expect(SUBACK)

    def disconnect(self, reason: int = 0, props=None) -> None:
        self.send(disconnect(reason, props, self.version))

    # -- receiving -----------------------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no data from the broker in time")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout as e:
            raise TimeoutError("no data from the broker in time") from e
        except ConnectionResetError as e:
            raise Closed("connection reset") from e
        if not chunk:
            raise Closed("connection closed by the broker")
        self.buf += chunk

    def recv_packet(self, timeout: float = 5.0) -> Packet:
        """The next whole packet. Raises TimeoutError or Closed."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 2:
                length, shift, i = 0, 0, 1
                complete = False
                while i < len(self.buf) and i <= 4:
                    b = self.buf[i]
                    length |= (b & 0x7F) << shift
                    shift += 7
                    i += 1
                    if not b & 0x80:
                        complete = True
                        break
                if not complete and i > 4:
                    raise ProtocolError("bad remaining length from broker")
                if complete and len(self.buf) >= i + length:
                    first = self.buf[0]
                    body = self.buf[i:i + length]
                    self.buf = self.buf[i + length:]
                    return decode(first, body, self.version)
            self._fill(deadline)

    def expect(self, kind: int, timeout: float = 5.0, keep_publishes: bool = True) -> Packet:
        """The next packet of type `kind`; PUBLISH packets read meanwhile are stored in
        `self.pending` when `keep_publishes`, any other packet type is an error."""
        deadline = time.monotonic() + timeout
        while True:
            p = self.recv_packet(max(0.0, deadline - time.monotonic()))
            if p.type == kind:
                return p
            if p.type == PUBLISH and keep_publishes:
                self.pending.append(p)
                continue
            raise AssertionError(f"expected {PACKET_NAMES[kind]}, got {p!r}")

    @property
    def pending(self) -> list:
        if not hasattr(self, "_pending"):
            self._pending = []
        return self._pending

    def next_publish(self, timeout: float = 5.0) -> Packet:
        if self.pending:
            return self.pending.pop(0)
        return self.expect(PUBLISH, timeout)

    def packets_until_close(self, timeout: float = 5.0) -> list[Packet]:
        """Every packet the broker sends until it closes the connection. Raises TimeoutError
        when the connection is still open after `timeout`."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                out.append(self.recv_packet(max(0.0, deadline - time.monotonic())))
            except Closed:
                return out

    def expect_disconnect_and_close(self, timeout: float = 5.0) -> Packet:
        """Reads until the broker closes; returns the DISCONNECT it sent first, which must be
        the last packet."""
        packets = self.packets_until_close(timeout)
        disconnects = [p for p in packets if p.type == DISCONNECT]
        assert disconnects, f"connection closed without DISCONNECT; got {packets!r}"
        assert packets[-1].type == DISCONNECT, f"DISCONNECT was not the last packet: {packets!r}"
        return disconnects[-1]

    def wait_closed(self, timeout: float = 5.0) -> bytes:
        """Waits until the broker closes the connection and returns every byte it sent."""
        deadline = time.monotonic() + timeout
        data = self.buf
        self.buf = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("connection still open")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout as e:
                raise TimeoutError(f"connection still open; received {data!r}") from e
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Closes with a TCP reset (SO_LINGER 0), like a crashed client."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
