"""Listeners of every kind: TLS, mutual TLS, WebSocket and WebSocket over TLS, with
mosquitto_pub/mosquitto_sub, paho-mqtt and raw sockets; bad clients on each; reloading
certificates with SIGHUP."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time

import paho.mqtt.client as mqtt
import pytest

from certs import issue, make_pki, write_crl
from helpers import (
    HOST, MQKV_BIN, PacketTypes, Paho, Proc, V5, V311, assert_healthy, props, run, wait_for,
)
from mqttraw import PUBACK, Closed, RawClient

needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None,
    reason="mosquitto-clients not installed (apt-get install mosquitto-clients)",
)


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_flags(pki, *extra):
    return ["--tls-cert", pki.server.cert_path, "--tls-key", pki.server.key_path, *extra]


def all_listeners(mqkv, pki, *extra):
    return mqkv(
        "--listen-tls", f"{HOST}:0", "--listen-ws", f"{HOST}:0", "--listen-wss", f"{HOST}:0",
        *tls_flags(pki), *extra,
    )


def trust(pki):
    return {"ca_certs": str(pki.ca.cert_path)}


# ---------------------------------------------------------------------------------------------
# Real clients on every listener
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("listener", ["tcp", "tls", "ws", "wss"])
@pytest.mark.parametrize("version", [V5, V311])
def test_paho_on_every_listener(mqkv, pki, listener, version):
    server = all_listeners(mqkv, pki)
    kw = {"listener": listener, "tls": trust(pki), "version": version}
    sub = Paho(server, f"sub-{listener}", **kw)
    assert sub.subscribe("every/#", 2) == [2]
    pub = Paho(server, f"pub-{listener}", **kw)
    big = os.urandom(300_000)
    for qos in (0, 1, 2):
        pub.publish(f"every/q{qos}", b"small %d" % qos, qos=qos)
        pub.publish(f"every/big{qos}", big, qos=qos)
    got = {}
    for _ in range(6):
        m = sub.get(10)
        got[m.topic] = m.payload
    assert got == {
        **{f"every/q{q}": b"small %d" % q for q in (0, 1, 2)},
        **{f"every/big{q}": big for q in (0, 1, 2)},
    }
    # Retained messages reach a later subscriber on another kind of listener.
    pub.publish("every/retained", b"kept", qos=1, retain=True)
    later = Paho(server, f"later-{listener}", listener="tcp")
    later.subscribe("every/retained", 1)
    m = later.get(5)
    assert (m.payload, m.retain) == (b"kept", True)
    for c in (pub, sub, later):
        c.disconnect()


@needs_mosquitto
@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_mosquitto_clients_over_tls(mqkv, pki, version):
    server = mqkv("--listen-tls", f"{HOST}:0", *tls_flags(pki))
    port = str(server.endpoints["tls"])
    common = ["-h", HOST, "-p", port, "--cafile", str(pki.ca.cert_path), "-V", version]
    # Retained first, before anyone subscribes, so it reaches the subscriber exactly once (as
    # the retained message on subscribe). A publish racing a new subscription may arrive twice.
    res = run(["mosquitto_pub", *common, "-t", "tls/retained", "-m", "r", "-q", "1", "-r"])
    assert res.returncode == 0, res.stderr
    sub = Proc(["mosquitto_sub", *common, "-t", "tls/#", "-q", "1", "-F", "%t|%p", "-C", "3"])
    sub.wait_line("tls/retained|r", timeout=10)
    for i in range(2):
        res = run(["mosquitto_pub", *common, "-t", f"tls/{i}", "-m", f"m{i}", "-q", "1"])
        assert res.returncode == 0, res.stderr
    assert sub.wait(10) == 0
    assert sub.output().splitlines()[-2:] == ["tls/0|m0", "tls/1|m1"]
    # A client that does not trust the server's CA gives up.
    res = run(["mosquitto_pub", "-h", HOST, "-p", port, "--cafile", str(pki.other_ca.cert_path),
               "-t", "tls/x", "-m", "x"])
    assert res.returncode != 0


@needs_mosquitto
def test_mutual_tls_with_mosquitto_clients(mqkv, pki):
    server = mqkv(
        "--listen-tls", f"{HOST}:0",
        *tls_flags(pki, "--tls-client-ca", pki.ca.cert_path, "--tls-require-client-cert"),
    )
    port = str(server.endpoints["tls"])
    base = ["-h", HOST, "-p", port, "--cafile", str(pki.ca.cert_path), "-V", "mqttv5"]

    def with_cert(who):
        return ["--cert", str(who.cert_path), "--key", str(who.key_path)]

    sub = Proc(["mosquitto_sub", *base, *with_cert(pki.client), "-t", "mtls/t", "-q", "1",
                "-C", "1", "-F", "%p"])
    deadline = time.monotonic() + 10
    while sub.proc.poll() is None and time.monotonic() < deadline:
        res = run(["mosquitto_pub", *base, *with_cert(pki.client), "-t", "mtls/t", "-m", "hi",
                   "-q", "1"])
        assert res.returncode == 0, res.stderr
        time.sleep(0.1)
    assert sub.wait(5) == 0 and sub.output().splitlines()[-1] == "hi"
    # No certificate, one from another CA, an expired one: each refused in the handshake.
    for extra in ([], with_cert(pki.stranger), with_cert(pki.expired)):
        res = run(["mosquitto_pub", *base, *extra, "-t", "mtls/t", "-m", "no", "-q", "1"])
        assert res.returncode != 0, f"accepted with {extra}"
    text = server.stderr_text()
    assert "TLS handshake failed" in text
    # Nobody else noticed.
    assert_healthy(server)


def test_optional_client_certificates(mqkv, pki):
    server = mqkv("--listen-tls", f"{HOST}:0",
                  *tls_flags(pki, "--tls-client-ca", pki.ca.cert_path))
    # Without a certificate: welcome.
    Paho(server, "no-cert", listener="tls", tls=trust(pki)).disconnect()
    # With a good one: welcome.
    good = {**trust(pki), "certfile": str(pki.client.cert_path),
            "keyfile": str(pki.client.key_path)}
    Paho(server, "good-cert", listener="tls", tls=good).disconnect()
    # With one that does not verify: refused.
    bad = {**trust(pki), "certfile": str(pki.stranger.cert_path),
           "keyfile": str(pki.stranger.key_path)}
    with pytest.raises((ssl.SSLError, ConnectionError, OSError, AssertionError)):
        Paho(server, "bad-cert", listener="tls", tls=bad, timeout=3)


def ws_listeners(pki):
    """A `wss` listener at path /custom and a `ws` listener at the default path."""
    return f"""
[[listeners]]
kind = "wss"
address = "{HOST}:0"
cert = "{pki.server.cert_path}"
key = "{pki.server.key_path}"
path = "/custom"

[[listeners]]
kind = "ws"
address = "{HOST}:0"
"""


def test_listeners_from_the_configuration_file(mqkv, pki, tmp_path):
    server = mqkv(config=ws_listeners(pki), listeners=2)
    assert set(server.endpoints) == {"tcp", "wss", "ws"}
    c = Paho(server, "custom-path", listener="wss", tls=trust(pki), ws_path="/custom")
    c.disconnect()
    d = Paho(server, "default-path", listener="ws")
    d.disconnect()


def test_a_plain_listener_beyond_loopback_is_warned_about(mqkv):
    server = mqkv("--listen-ws", "0.0.0.0:0")
    wait_for(lambda: "non-loopback address" in server.stderr_text(), what="a warning")


# ---------------------------------------------------------------------------------------------
# WebSocket framing with a raw client
# ---------------------------------------------------------------------------------------------


class RawWs:
    """A WebSocket client written out by hand, to send frames real clients would not."""

    def __init__(self, port, *, path="/mqtt", protocol="mqtt", extra_headers="", source=None):
        """`source`: the local address to connect from (127.0.0.5, say)."""
        self.sock = socket.create_connection(
            (HOST, port), timeout=5, source_address=(source, 0) if source else None)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        )
        if protocol:
            request += f"Sec-WebSocket-Protocol: {protocol}\r\n"
        self.sock.sendall((request + extra_headers + "\r\n").encode())
        self.head = b""
        while b"\r\n\r\n" not in self.head:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.head += chunk
        self.head, _, self.buf = self.head.partition(b"\r\n\r\n")

    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    def send_frame(self, payload: bytes, opcode=2, fin=True):
        first = (0x80 if fin else 0) | opcode
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", first, 0x80 | n)
        elif n < 65536:
            header = struct.pack("!BBH", first, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", first, 0x80 | 127, n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + body)

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self):
        b0, b1 = self._need(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._need(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._need(8))
        return b0 & 0x0F, self._need(n)

    def recv_mqtt(self) -> bytes:
        """The payload of the next binary frame."""
        while True:
            op, payload = self.recv_frame()
            if op == 2:
                return payload

    def closed(self, timeout=5.0) -> bool:
        """Whether the server closes the connection (a close frame, then EOF) in time."""
        self.sock.settimeout(timeout)
        try:
            while True:
                op, _ = self.recv_frame()
                if op == 8:
                    return True
        except (ConnectionError, OSError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def connect_packet(client_id: str) -> bytes:
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + struct.pack("!H", len(cid)) + cid
    return bytes([0x10, len(body)]) + body


def test_websocket_frames_and_packets_need_not_line_up(mqkv):
    server = mqkv("--listen-ws", f"{HOST}:0")
    ws = RawWs(server.endpoints["ws"])
    assert ws.status() == 101
    assert b"sec-websocket-protocol: mqtt" in ws.head.lower()
    # CONNECT split across two frames.
    connect = connect_packet("raw-ws")
    ws.send_frame(connect[:5])
    ws.send_frame(connect[5:])
    connack = ws.recv_mqtt()
    assert connack[0] == 0x20 and connack[3] == 0
    # SUBSCRIBE, PUBLISH (to itself) and PINGREQ in one frame.
    topic = b"ws/raw"
    sub_body = struct.pack("!H", 1) + b"\x00" + struct.pack("!H", len(topic)) + topic + b"\x00"
    subscribe = bytes([0x82, len(sub_body)]) + sub_body
    pub_body = struct.pack("!H", len(topic)) + topic + b"\x00" + b"payload"
    publish = bytes([0x30, len(pub_body)]) + pub_body
    ws.send_frame(subscribe + publish + b"\xc0\x00")
    got = b""
    while b"payload" not in got or b"\xd0\x00" not in got:
        got += ws.recv_mqtt()
    assert got.startswith(b"\x90")  # SUBACK first
    # One message sent as three fragments (a binary frame and two continuations).
    body2 = pub_body.replace(b"payload", b"pieces")
    pub2 = bytes([0x30, len(body2)]) + body2
    ws.send_frame(pub2[:3], opcode=2, fin=False)
    ws.send_frame(pub2[3:8], opcode=0, fin=False)
    ws.send_frame(pub2[8:], opcode=0, fin=True)
    got = b""
    while b"pieces" not in got:
        got += ws.recv_mqtt()
    # A WebSocket ping is answered with a pong carrying the same data.
    ws.send_frame(b"hello", opcode=9)
    while True:
        op, payload = ws.recv_frame()
        if op == 10:
            assert payload == b"hello"
            break
    # A text frame breaks the MQTT binding: the connection is closed.
    ws.send_frame(b"not mqtt", opcode=1)
    assert ws.closed()
    ws.close()
    assert_healthy(server)


def test_websocket_oversized_frame_is_refused(mqkv):
    server = mqkv("--listen-ws", f"{HOST}:0", "--max-packet-size", "1000")
    ws = RawWs(server.endpoints["ws"])
    connect = connect_packet("big-frame")
    ws.send_frame(connect)
    assert ws.recv_mqtt()[0] == 0x20
    # A frame header announcing 100 MiB: refused without waiting for the bytes.
    mask = os.urandom(4)
    ws.sock.sendall(struct.pack("!BBQ", 0x82, 0x80 | 127, 100 << 20) + mask + b"\x00" * 1024)
    assert ws.closed()
    ws.close()
    assert_healthy(server)


@pytest.mark.parametrize(
    "path,protocol,extra,status",
    [
        ("/other", "mqtt", "", 404),
        ("/mqtt", "chat", "", 400),
        ("/mqtt", "mqtt", "X-Filler: " + "x" * 9000 + "\r\n", 431),
    ],
)
def test_websocket_upgrades_that_are_refused(mqkv, path, protocol, extra, status):
    server = mqkv("--listen-ws", f"{HOST}:0")
    ws = RawWs(server.endpoints["ws"], path=path, protocol=protocol, extra_headers=extra)
    assert ws.status() == status, ws.head
    ws.close()
    assert_healthy(server)


def test_plain_http_on_the_websocket_path_gets_an_http_error(mqkv):
    server = mqkv("--listen-ws", f"{HOST}:0")
    with socket.create_connection((HOST, server.endpoints["ws"]), timeout=5) as s:
        s.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 426 Upgrade Required"), reply
    assert b"MQTT over WebSocket" in reply


# ---------------------------------------------------------------------------------------------
# Bad clients on TLS listeners
# ---------------------------------------------------------------------------------------------


def closes_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionError, OSError) as e:
        return not isinstance(e, socket.timeout)


def test_garbage_and_plaintext_on_a_tls_port_are_refused_at_once(mqkv, pki):
    server = mqkv("--listen-tls", f"{HOST}:0", *tls_flags(pki))
    port = server.endpoints["tls"]
    with socket.create_connection((HOST, port)) as s:
        s.sendall(os.urandom(2000))
        assert closes_within(s, 3)
    with socket.create_connection((HOST, port)) as s:
        s.sendall(connect_packet("plaintext"))
        assert closes_within(s, 3)
    wait_for(lambda: "TLS handshake failed" in server.stderr_text(), what="a log line")
    Paho(server, "after-garbage", listener="tls", tls=trust(pki)).disconnect()


def test_a_client_stalled_mid_handshake_is_dropped_and_nobody_waits(mqkv, pki):
    server = mqkv("--listen-tls", f"{HOST}:0", "--listen-wss", f"{HOST}:0", *tls_flags(pki))
    stalled = [socket.create_connection((HOST, server.endpoints[k])) for k in ("tls", "wss")]
    # Half a ClientHello on one, a TLS session but no HTTP request on the other.
    stalled[0].sendall(b"\x16\x03\x01\x02\x00\x01\x00")
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    stalled[1] = ctx.wrap_socket(stalled[1], server_hostname="localhost")
    started = time.monotonic()
    # Meanwhile other clients come and go on the same listeners.
    for kind in ("tls", "wss"):
        Paho(server, f"meanwhile-{kind}", listener=kind, tls=trust(pki)).disconnect()
    for s in stalled:
        assert closes_within(s, 15), "a stalled handshake was never dropped"
        s.close()
    assert time.monotonic() - started < 15
    wait_for(lambda: "handshake not finished in time" in server.stderr_text(), what="a log line")
    assert_healthy(server)


# ---------------------------------------------------------------------------------------------
# Reloading certificates
# ---------------------------------------------------------------------------------------------


def test_sighup_reloads_certificates_and_keeps_clients(mqkv, pki, tmp_path):
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.server.cert_path, cert)
    shutil.copy(pki.server.key_path, key)
    server = mqkv("--listen-tls", f"{HOST}:0", "--tls-cert", cert, "--tls-key", key,
                  "--watch-interval-ms", "0")
    before = Paho(server, "before", listener="tls", tls=trust(pki))
    before.subscribe("reload/t", 1)

    shutil.copy(pki.other_server.cert_path, cert)
    shutil.copy(pki.other_server.key_path, key)
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS certificate and key reloaded" in server.stderr_text(),
             what="the reload")
    # New clients get the new certificate: trusting only the new CA works ...
    after = Paho(server, "after", listener="tls", tls={"ca_certs": str(pki.other_ca.cert_path)})
    # ... and trusting only the old one no longer does.
    with pytest.raises((ssl.SSLError, OSError)):
        Paho(server, "old-trust", listener="tls", tls=trust(pki), timeout=3)
    # The client connected before the reload is still there.
    after.publish("reload/t", b"still here", qos=1)
    assert before.get(5).payload == b"still here"

    # A broken file: the reload fails, says why, and the certificate in use stays.
    cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS reload failed" in server.stderr_text(), what="the failed reload")
    Paho(server, "after-bad", listener="tls",
         tls={"ca_certs": str(pki.other_ca.cert_path)}).disconnect()
    before.disconnect()
    after.disconnect()


def test_raw_mqtt_limits_hold_over_tls(mqkv, pki):
    """The broker's checks are the transport's too: a malformed packet over TLS gets the
    DISCONNECT it gets over TCP."""
    server = mqkv("--listen-tls", f"{HOST}:0", *tls_flags(pki))
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    with socket.create_connection((HOST, server.endpoints["tls"]), timeout=5) as plain:
        s = ctx.wrap_socket(plain, server_hostname="localhost")
        s.sendall(connect_packet("tls-raw"))
        assert read_packet(s)[0] == 0x20
        # PUBLISH with a topic holding a wildcard: Topic Name invalid (0x90).
        body = struct.pack("!H", 3) + b"a/#" + b"\x00"
        s.sendall(bytes([0x30, len(body)]) + body)
        reply = read_packet(s)
        assert reply[0] == 0xE0 and reply[2] == 0x90, reply  # Topic Name invalid


def tls_session(server, ctx, client_id, session=None, publish=()):
    """Connects over TLS (resuming `session` if given) with a raw MQTT client, publishes each of
    `publish` at QoS 1, and disconnects. Returns the TLS session to resume, whether this one
    was resumed, and the PUBACK reason codes."""
    c = RawClient(HOST, server.endpoints["tls"])
    c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost", session=session)
    assert c.connect(client_id).reason == 0
    codes = []
    for i, topic in enumerate(publish, start=1):
        c.publish(topic, b"x", qos=1, packet_id=i)
        codes.append(c.expect(PUBACK).reason)
    c.disconnect()
    # Read to the end, so that the session tickets that came after the handshake are taken in.
    c.wait_closed()
    return c.sock.session, c.sock.session_reused, codes


def test_any_number_of_clients_resume_their_tls_sessions(mqkv, pki):
    """A client that comes back resumes its TLS session (no certificate signature, one round
    trip less), however many other clients connected in between: tickets, not a cache that
    remembers the last few hundred sessions."""
    server = mqkv("--listen-tls", f"{HOST}:0", *tls_flags(pki))
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    first, reused, _ = tls_session(server, ctx, "first")
    assert not reused
    for i in range(300):
        tls_session(server, ctx, f"between-{i}")
    _, reused, _ = tls_session(server, ctx, "first", session=first)
    assert reused, "the session from before 300 other clients was not resumed"
    # After a reload, every connection makes a full handshake with what was loaded.
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS certificate and key reloaded" in server.stderr_text(),
             what="the reload")
    again, reused, _ = tls_session(server, ctx, "first", session=first)
    assert not reused, "a session from before the reload was resumed"
    _, reused, _ = tls_session(server, ctx, "first", session=again)
    assert reused


def test_a_resumed_session_keeps_its_client_certificate_identity(mqkv, pki, tmp_path):
    """A client that resumes a session made with its certificate is still that certificate's
    holder: its name and the attributes of the subjects in its chain."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("""
- principals: { usernames: [device-1] }
  brokerResources:
    - method: Connect
    - method: Publish
      topics: ["devices/{principal.username}/#"]
- principals:
    attributes: [{ organization: contoso }]
  brokerResources:
    - method: Publish
      topics: ["org/{principal.attributes.organization}/#"]
""")
    server = mqkv(
        "--listen-tls", f"{HOST}:0",
        *tls_flags(pki, "--tls-client-ca", pki.ca.cert_path, "--tls-require-client-cert"),
        "--policy", policy,
        config=f"""
[[certificate_attributes]]
subject = "{pki.ca.cert.subject.rfc4514_string()}"
attributes = {{ organization = "contoso" }}
""",
    )
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    ctx.load_cert_chain(pki.client.cert_path, pki.client.key_path)
    topics = ["devices/device-1/t", "org/contoso/t", "devices/device-2/t"]
    # Allowed, with no subscribers (0x10); allowed through the CA's attribute; not allowed.
    expected = [0x10, 0x10, 0x87]
    session, reused, codes = tls_session(server, ctx, "dev", publish=topics)
    assert not reused and codes == expected
    _, reused, codes = tls_session(server, ctx, "dev", session=session, publish=topics)
    assert reused
    assert codes == expected


def test_revoked_client_certificates_are_refused(mqkv, pki, tmp_path):
    """With a revocation list, a client certificate it lists is refused in the handshake. A
    reload brings in a new list: connected clients stay, and a newly revoked client can neither
    connect nor resume a session it had."""
    revoked = issue(pki.directory, "revoked", pki.ca, "device-9", server=False)
    crl = write_crl(tmp_path / "crl.pem", pki.ca, [revoked])
    server = mqkv(
        "--listen-tls", f"{HOST}:0",
        *tls_flags(pki, "--tls-client-ca", pki.ca.cert_path, "--tls-require-client-cert",
                   "--tls-crl", crl, "--watch-interval-ms", "0"),
    )

    def holder(who):
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
        ctx.load_cert_chain(who.cert_path, who.key_path)
        return ctx

    def refused(ctx, session=None):
        with pytest.raises((ssl.SSLError, OSError, Closed)):
            tls_session(server, ctx, "refused", session=session)

    good = holder(pki.client)
    first, _, _ = tls_session(server, good, "good")
    # The good client can resume: what is refused below is the resumption itself.
    session, reused, _ = tls_session(server, good, "good", session=first)
    assert reused
    refused(holder(revoked))
    wait_for(lambda: "TLS handshake failed" in server.stderr_text(), what="the log line")
    stays = Paho(server, "stays", listener="tls",
                 tls={**trust(pki), "certfile": str(pki.client.cert_path),
                      "keyfile": str(pki.client.key_path)})

    # Revoke the good client's certificate too, and reload.
    write_crl(crl, pki.ca, [revoked, pki.client])
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS certificate and key reloaded" in server.stderr_text(),
             what="the reload")
    refused(good)
    refused(good, session=session)
    assert stays.publish("crl/t", b"still here", qos=1) == 0x10

    # A broken list: the reload fails and the one in force stays.
    crl.write_text("-----BEGIN X509 CRL-----\nnot base64\n-----END X509 CRL-----\n")
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "TLS reload failed" in server.stderr_text(), what="the failed reload")
    refused(good)
    other = issue(pki.directory, "not-revoked", pki.ca, "device-3", server=False)
    tls_session(server, holder(other), "not-revoked")
    assert_healthy(server)


def test_a_revocation_list_needs_a_client_ca(mqkv, pki, tmp_path):
    crl = write_crl(tmp_path / "crl.pem", pki.ca, [])
    res = subprocess.run(
        [MQKV_BIN, "serve", "--listen-tls", f"{HOST}:0", *map(str, tls_flags(pki)),
         "--tls-crl", str(crl), "--storage", "memory"],
        capture_output=True, timeout=30, cwd=tmp_path)
    assert res.returncode != 0
    assert "need a client CA bundle" in res.stderr.decode(), res.stderr


def test_a_listener_can_take_tls_1_3_only(mqkv, pki, tmp_path):
    def version(server, newest=None):
        ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
        if newest is not None:
            ctx.maximum_version = newest
        c = RawClient(HOST, server.endpoints["tls"])
        c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
        assert c.connect("v").reason == 0
        c.disconnect()
        return c.sock.version()

    default = mqkv("--listen-tls", f"{HOST}:0", *tls_flags(pki))
    assert version(default) == "TLSv1.3"
    assert version(default, ssl.TLSVersion.TLSv1_2) == "TLSv1.2"
    strict = mqkv("--listen-tls", f"{HOST}:0", *tls_flags(pki), "--tls-min-version", "1.3")
    assert version(strict) == "TLSv1.3"
    with pytest.raises((ssl.SSLError, OSError, Closed)):
        version(strict, ssl.TLSVersion.TLSv1_2)
    res = subprocess.run(
        [MQKV_BIN, "serve", "--listen-tls", f"{HOST}:0", *map(str, tls_flags(pki)),
         "--tls-min-version", "1.1", "--storage", "memory"],
        capture_output=True, timeout=30, cwd=tmp_path)
    assert res.returncode != 0 and "give 1.2 or 1.3" in res.stderr.decode(), res.stderr


def read_packet(s) -> bytes:
    """One whole MQTT packet (its remaining length under 128 bytes) from a socket."""
    head = b""
    while len(head) < 2:
        chunk = s.recv(2 - len(head))
        assert chunk, "closed"
        head += chunk
    body = b""
    while len(body) < head[1]:
        chunk = s.recv(head[1] - len(body))
        assert chunk, "closed"
        body += chunk
    return head + body


# ---------------------------------------------------------------------------------------------
# Clients that leave Nagle's algorithm on
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("listener", ["tls", "ws", "wss"])
def test_a_burst_published_while_deliveries_arrive_comes_back_whole(mqkv, pki, listener):
    """A client publishes 2,000 QoS 1 messages to its own subscription as fast as it can,
    while the broker's deliveries and acknowledgements stream back on the same connection:
    every message arrives once and in order, and the connection stays up."""
    server = all_listeners(mqkv, pki)
    c = Paho(server, f"burst-{listener}", listener=listener, tls=trust(pki))
    assert c.subscribe("burst/t", 1) == [1]
    n = 2000
    for i in range(n):
        c.publish("burst/t", b"%d" % i, qos=1, wait=False)
    got = [m.payload for m in c.collect(n, timeout=20)]
    assert got == [b"%d" % i for i in range(n)]
    assert not c.disconnected.is_set()


# Linux holds back an ACK that has no data to ride on for at least 40 ms. A client with Nagle's
# algorithm on holds its next small packet until its last one is acknowledged.
DELAYED_ACK_S = 0.040


def nagle_is_on(client: Paho) -> bool:
    """Whether the client's TCP socket has Nagle's algorithm on, as paho-mqtt leaves it."""
    sock = client.client.socket()
    sock = getattr(sock, "_socket", sock)  # under paho's WebSocket wrapper
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0


@pytest.mark.parametrize("listener", ["tcp", "tls", "ws", "wss"])
def test_a_nagle_client_that_publishes_never_waits_for_a_delayed_ack(mqkv, pki, listener):
    """A client that publishes at QoS 1 and receives the message back acknowledges the
    delivery, then publishes again: with Nagle's algorithm on, that publish waits until the
    broker's side acknowledges the PUBACK. The broker has it acknowledged at once, on every
    listener kind, so no round trip waits for a delayed ACK."""
    server = all_listeners(mqkv, pki)
    c = Paho(server, f"nagle-{listener}", listener=listener, tls=trust(pki))
    assert c.subscribe("nagle/echo", 1) == [1]
    assert nagle_is_on(c), "paho-mqtt was expected to leave Nagle's algorithm on"
    rounds = []
    for i in range(20):
        started = time.monotonic()
        c.publish("nagle/echo", b"%d" % i, qos=1, wait=False)
        assert c.get(10).payload == b"%d" % i
        rounds.append(time.monotonic() - started)
    rounds.sort()
    # Waiting for delayed ACKs, every round trip after the first takes 40 ms or more.
    assert rounds[len(rounds) // 2] < DELAYED_ACK_S / 2, rounds


@pytest.mark.parametrize("listener", ["tcp", "tls"])
def test_a_nagle_subscriber_with_a_small_receive_maximum_keeps_up(mqkv, pki, listener):
    """A client that only subscribes gets no quick ACKs: it acknowledges each delivery in
    answer to it, and the next delivery carries the ACK its held acknowledgements wait for.
    With a receive maximum of 2, a burst of QoS 1 messages still flows without delayed-ACK
    waits, every one delivered once and in order."""
    server = all_listeners(mqkv, pki)
    narrow = props(PacketTypes.CONNECT, ReceiveMaximum=2)
    sub = Paho(server, f"narrow-{listener}", listener=listener, tls=trust(pki),
               properties=narrow)
    assert sub.subscribe("narrow/t", 1) == [1]
    assert nagle_is_on(sub)
    pub = Paho(server, f"narrow-pub-{listener}", listener=listener, tls=trust(pki))
    n = 400
    started = time.monotonic()
    for i in range(n):
        pub.publish("narrow/t", b"%d" % i, qos=1, wait=False)
    got = [m.payload for m in sub.collect(n, timeout=10)]
    took = time.monotonic() - started
    assert got == [b"%d" % i for i in range(n)]
    # Stalled on delayed ACKs, each window of two would wait 40 ms: 8 s in all.
    assert took < n / 2 * DELAYED_ACK_S / 4, took


# ---------------------------------------------------------------------------------------------
# mqkv's own commands over TLS
# ---------------------------------------------------------------------------------------------


def test_mqkv_commands_reach_a_tls_listener_with_a_client_certificate(mqkv, pki):
    server = mqkv("--listen-tls", f"{HOST}:0",
                  *tls_flags(pki, "--tls-client-ca", pki.ca.cert_path, "--tls-require-client-cert"))
    port = str(server.endpoints["tls"])

    def mqkv_cli(*args, tls=("--cafile", pki.ca.cert_path, "--cert", pki.client.cert_path,
                             "--key", pki.client.key_path)):
        return run([MQKV_BIN, *args, "--port", port, "--timeout", "3000", *map(str, tls)])

    res = mqkv_cli("set", "over-tls", "yes")
    assert res.returncode == 0, res.stderr
    res = mqkv_cli("get", "over-tls")
    assert (res.returncode, res.stdout) == (0, b"yes\n"), res.stderr
    res = mqkv_cli("reload")
    assert (res.returncode, res.stdout.strip()) == (0, b"reloaded"), res.stderr
    # The same port without a client certificate, or trusting another CA: refused, and said.
    res = mqkv_cli("get", "over-tls", tls=("--cafile", pki.ca.cert_path))
    assert res.returncode == 3 and b"cannot connect" in res.stderr, res.stderr
    res = mqkv_cli("get", "over-tls", tls=("--cafile", pki.other_ca.cert_path, "--cert",
                                           pki.client.cert_path, "--key", pki.client.key_path))
    assert res.returncode == 3 and b"cannot connect" in res.stderr, res.stderr
    # Without TLS at all, the TLS port does not answer MQTT.
    res = mqkv_cli("get", "over-tls", tls=())
    assert res.returncode == 3, res.stderr
    # A key without a certificate is a usage error.
    res = mqkv_cli("get", "over-tls", tls=("--cafile", pki.ca.cert_path, "--key",
                                           pki.client.key_path))
    assert res.returncode != 0 and b"--cert" in res.stderr, res.stderr
    # A file that is not a CA certificate is named.
    res = mqkv_cli("get", "over-tls", tls=("--cafile", pki.client.key_path))
    assert res.returncode == 3 and str(pki.client.key_path).encode() in res.stderr, res.stderr


def test_mqkv_commands_reach_websocket_listeners(mqkv, pki):
    server = mqkv(config=ws_listeners(pki), listeners=2)

    def mqkv_cli(kind, *args):
        return run([MQKV_BIN, *args, "--port", str(server.endpoints[kind]), "--timeout", "3000"])

    res = mqkv_cli("ws", "set", "over-ws", "yes", "--ws")
    assert res.returncode == 0, res.stderr
    res = mqkv_cli("ws", "get", "over-ws", "--ws=/mqtt")
    assert (res.returncode, res.stdout) == (0, b"yes\n"), res.stderr
    # The administrative requests (their own MQTT exchange) go over WebSocket too.
    res = mqkv_cli("ws", "reload", "--ws")
    assert (res.returncode, res.stdout.strip()) == (0, b"reloaded"), res.stderr
    # Secure WebSocket on its own path: the value written over plain WebSocket is there.
    res = mqkv_cli("wss", "get", "over-ws", "--ws=/custom", "--cafile", pki.ca.cert_path)
    assert (res.returncode, res.stdout) == (0, b"yes\n"), res.stderr
    res = mqkv_cli("wss", "set", "over-wss", "also", "--ws=/custom", "--cafile", pki.ca.cert_path)
    assert res.returncode == 0, res.stderr
    assert mqkv_cli("tcp", "get", "over-wss").stdout == b"also\n"
    # A path the listener does not serve, a CA that did not sign the server's certificate, and
    # WebSocket to a plain MQTT port: refused, and said.
    for kind, flags in [("wss", ["--ws=/mqtt", "--cafile", pki.ca.cert_path]),
                        ("wss", ["--ws=/custom", "--cafile", pki.other_ca.cert_path]),
                        ("ws", ["--ws=/custom"]),
                        ("tcp", ["--ws"])]:
        res = mqkv_cli(kind, "get", "over-ws", *flags)
        assert res.returncode == 3 and b"cannot connect" in res.stderr, (flags, res.stderr)
    # A path that is not one is a usage error, named before anything is sent.
    res = mqkv_cli("ws", "get", "over-ws", "--ws=mqtt")
    assert res.returncode != 0 and b"must start with '/'" in res.stderr, res.stderr
    assert server.alive()
