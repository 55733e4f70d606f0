"""CONNECT / CONNACK, sessions, keep alive, authentication, takeover, graceful shutdown."""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time

import pytest

import mqttraw as r
from helpers import (
    MQKV_BIN, V311, PacketTypes, Paho, assert_healthy, prop, props, raw, raw_connected, wait_for,
)

CONNECT = PacketTypes.CONNECT
DISCONNECT = PacketTypes.DISCONNECT


# -- client identifiers -------------------------------------------------------------------------


def test_assigned_client_identifier_for_empty_id(server):
    a = Paho(server, "")
    b = Paho(server, "")
    ida = prop(a.connack_props, "AssignedClientIdentifier")
    idb = prop(b.connack_props, "AssignedClientIdentifier")
    assert ida and idb, f"no Assigned Client Identifier in CONNACK: {a.connack_props}"
    assert ida != idb
    # The same on the wire, and the assigned id is a working identity: a second connection
    # with it and a kept session finds that session.
    c = raw(server)
    ack = c.connect("", props=[(r.SESSION_EXPIRY_INTERVAL, 60)])
    assert ack.reason == 0
    assigned = ack.prop(r.ASSIGNED_CLIENT_IDENTIFIER)
    assert assigned
    c.disconnect()
    c.wait_closed()
    again = raw(server).connect(assigned, clean_start=False,
                                props=[(r.SESSION_EXPIRY_INTERVAL, 60)])
    assert again.reason == 0 and again.session_present is True


def test_v5_client_id_given_is_not_reassigned(server):
    c = Paho(server, "given-id")
    assert prop(c.connack_props, "AssignedClientIdentifier") is None


def test_v311_empty_client_id_with_clean_session_0_is_rejected(server):
    c = raw(server, r.V311)
    c.send(r.connect("", version=r.V311, clean_start=False))
    ack = c.expect(r.CONNACK)
    assert ack.reason == 0x02, f"expected return code 2 (identifier rejected), got {ack!r}"
    assert ack.session_present is False
    c.wait_closed()


def test_v311_empty_client_id_with_clean_session_1_is_accepted(server):
    c = raw(server, r.V311)
    ack = c.connect("", version=r.V311, clean_start=True)
    assert ack.reason == 0
    assert ack.body == b"\x00\x00", f"3.1.1 CONNACK must be 2 bytes, got {ack.body!r}"


# -- clean start, session present, session expiry ---------------------------------------------


def test_clean_start_and_session_present_v5(server):
    expiry = props(CONNECT, SessionExpiryInterval=60)
    c = Paho(server, "cs", clean_start=True, properties=expiry)
    assert c.session_present is False
    c.disconnect()
    c = Paho(server, "cs", clean_start=False, properties=expiry)
    assert c.session_present is True
    c.disconnect()
    c = Paho(server, "cs", clean_start=True, properties=expiry)
    assert c.session_present is False, "clean start must discard the existing session"
    c.disconnect()


def test_clean_session_and_session_present_v311(server):
    c = Paho(server, "cs311", version=V311, clean_start=False)
    assert c.session_present is False
    assert c.subscribe("v311/persist", 1) == [1]
    c.disconnect()
    pub = Paho(server, "pub311", version=V311)
    pub.publish("v311/persist", b"while away", qos=1)
    c = Paho(server, "cs311", version=V311, clean_start=False)
    assert c.session_present is True
    m = c.get()
    assert (m.topic, m.payload, m.qos) == ("v311/persist", b"while away", 1)
    c.disconnect()
    c = Paho(server, "cs311", version=V311, clean_start=True)
    assert c.session_present is False


def test_session_expiry_zero_ends_session_at_disconnect(server):
    c = Paho(server, "exp0", properties=props(CONNECT, SessionExpiryInterval=0))
    assert c.subscribe("exp0/t", 1) == [1]
    c.disconnect()
    pub = Paho(server, "exp0-pub")
    # With the session gone there is no subscriber: MQTT 5 PUBACK says 0x10.
    assert pub.publish("exp0/t", b"x", qos=1) == 0x10
    c = Paho(server, "exp0", clean_start=False, properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.session_present is False
    c.expect_nothing(0.3)


def test_session_expiry_keeps_session_and_queues_messages(server):
    c = Paho(server, "keep", properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.subscribe("keep/t", 1) == [1]
    c.disconnect()
    pub = Paho(server, "keep-pub")
    assert pub.publish("keep/t", b"queued while away", qos=1) == 0
    c = Paho(server, "keep", clean_start=False,
             properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.session_present is True
    m = c.get()
    assert (m.topic, m.payload, m.qos) == ("keep/t", b"queued while away", 1)


def test_session_expires_after_interval(server):
    c = Paho(server, "short", properties=props(CONNECT, SessionExpiryInterval=1))
    assert c.subscribe("short/t", 1) == [1]
    c.disconnect()
    time.sleep(2.0)
    c = Paho(server, "short", clean_start=False,
             properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.session_present is False, "session outlived its 1 s expiry interval"


def test_session_expiry_set_to_zero_by_disconnect(server):
    c = Paho(server, "upd0", properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.subscribe("upd0/t", 1) == [1]
    c.disconnect(0, props(DISCONNECT, SessionExpiryInterval=0))
    c = Paho(server, "upd0", clean_start=False,
             properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.session_present is False, "DISCONNECT with Session Expiry Interval 0 must end it"


def test_disconnect_is_handled_before_the_next_connection_takes_over(server):
    # Consecutive connections may be served by different threads; the new connection's CONNECT
    # must not overtake the DISCONNECT the old one already received.
    for i in range(20):
        c = Paho(server, f"order{i}", properties=props(CONNECT, SessionExpiryInterval=60))
        c.disconnect(0, props(DISCONNECT, SessionExpiryInterval=0))
        c = Paho(server, f"order{i}", clean_start=False,
                 properties=props(CONNECT, SessionExpiryInterval=60))
        assert c.session_present is False, f"round {i}: the DISCONNECT was overtaken"
        c.disconnect()


def test_session_expiry_extended_by_disconnect(server):
    c = Paho(server, "upd", properties=props(CONNECT, SessionExpiryInterval=1))
    assert c.subscribe("upd/t", 1) == [1]
    c.disconnect(0, props(DISCONNECT, SessionExpiryInterval=60))
    time.sleep(2.0)
    pub = Paho(server, "upd-pub")
    assert pub.publish("upd/t", b"after 2 s", qos=1) == 0
    c = Paho(server, "upd", clean_start=False,
             properties=props(CONNECT, SessionExpiryInterval=60))
    assert c.session_present is True, "DISCONNECT raised the expiry to 60 s; session lost"
    assert c.get().payload == b"after 2 s"


def test_disconnect_raising_expiry_from_zero_is_protocol_error(server):
    c = raw_connected(server, "zero-then-more")  # Session Expiry Interval absent: 0
    c.disconnect(0, [(r.SESSION_EXPIRY_INTERVAL, 30)])
    d = c.expect_disconnect_and_close()
    assert d.reason == 0x82


def test_max_session_expiry_caps_the_interval(mqkv):
    s = mqkv("--max-session-expiry", "10")
    c = Paho(s, "capped", properties=props(CONNECT, SessionExpiryInterval=3600))
    assert prop(c.connack_props, "SessionExpiryInterval") == 10
    d = Paho(s, "uncapped", properties=props(CONNECT, SessionExpiryInterval=5))
    assert prop(d.connack_props, "SessionExpiryInterval") is None


# -- keep alive ---------------------------------------------------------------------------------


def test_server_keep_alive_override(mqkv):
    s = mqkv("--max-keep-alive", "5")
    c = Paho(s, "ka", keepalive=60)
    assert prop(c.connack_props, "ServerKeepAlive") == 5
    zero = raw(s).connect("ka0", keep_alive=0)
    assert zero.reason == 0 and zero.prop(r.SERVER_KEEP_ALIVE) == 5
    low = raw(s).connect("ka3", keep_alive=3)
    assert low.reason == 0 and low.prop(r.SERVER_KEEP_ALIVE) is None


def test_no_server_keep_alive_by_default(server):
    c = Paho(server, "ka-default", keepalive=60)
    assert prop(c.connack_props, "ServerKeepAlive") is None


def test_keep_alive_timeout_disconnects_with_0x8d(server):
    c = raw(server)
    assert c.connect("silent", keep_alive=1).reason == 0
    start = time.monotonic()
    d = c.expect_disconnect_and_close(timeout=3.0)
    elapsed = time.monotonic() - start
    assert d.reason == 0x8D, f"expected DISCONNECT 0x8D, got {d!r}"
    assert elapsed >= 0.9, f"disconnected after {elapsed:.2f}s, before the keep alive elapsed"


def test_keep_alive_kept_by_pings(server):
    c = raw_connected(server, "pinger", keep_alive=1)
    for _ in range(4):
        time.sleep(0.6)
        c.send(r.pingreq())
        assert c.expect(r.PINGRESP, 2).type == r.PINGRESP
    # 2.4 s of life with keep alive 1: pings keep it open.


def test_keep_alive_counts_from_the_last_packet(server):
    c = raw_connected(server, "late-silence", keep_alive=2)
    time.sleep(1.5)
    start = time.monotonic()
    c.send(r.pingreq())
    assert c.expect(r.PINGRESP, 2).type == r.PINGRESP
    d = c.expect_disconnect_and_close(timeout=6.0)
    elapsed = time.monotonic() - start
    assert d.reason == 0x8D, f"expected DISCONNECT 0x8D, got {d!r}"
    # One and a half keep alives (3 s) after the ping; counted from the CONNECT it would
    # have come 1.5 s after the ping.
    assert 2.6 <= elapsed <= 4.5, f"disconnected {elapsed:.2f}s after the last packet"


# -- CONNACK properties -------------------------------------------------------------------------


def test_connack_advertises_limits(mqkv):
    s = mqkv("--receive-maximum", "7", "--max-packet-size", "4096",
             "--topic-alias-maximum", "9")
    c = Paho(s, "limits")
    p = c.connack_props
    assert prop(p, "ReceiveMaximum") == 7
    assert prop(p, "MaximumPacketSize") == 4096
    assert prop(p, "TopicAliasMaximum") == 9


def test_connack_defaults_present(server):
    ack = raw(server).connect("defaults")
    assert ack.reason == 0
    assert ack.prop(r.RECEIVE_MAXIMUM) is not None
    assert ack.prop(r.MAXIMUM_PACKET_SIZE) is not None
    assert ack.prop(r.TOPIC_ALIAS_MAXIMUM) is not None


def test_request_response_information(server):
    c = Paho(server, "rri", properties=props(CONNECT, RequestResponseInformation=1))
    info = prop(c.connack_props, "ResponseInformation")
    assert isinstance(info, str) and info, "Response Information missing from CONNACK"
    plain = Paho(server, "no-rri")
    assert prop(plain.connack_props, "ResponseInformation") is None


def test_user_properties_on_connect_accepted(server):
    p = props(CONNECT, UserProperty=[("app", "interop"), ("app", "twice"), ("k", "")])
    c = Paho(server, "uprops", properties=p)
    assert c.connack[0] == 0
    assert c.subscribe("up/t", 0) == [0]


# -- authentication -----------------------------------------------------------------------------

def password_file(tmp_path, users: dict[str, str]):
    """A password file made with `mqkv passwd`, one call per user."""
    path = tmp_path / "passwords"
    for user, password in users.items():
        res = subprocess.run([MQKV_BIN, "passwd", str(path), user, "--password-stdin"],
                             input=password.encode() + b"\n", capture_output=True, timeout=30)
        assert res.returncode == 0, res.stderr
    return path


@pytest.fixture
def users(tmp_path):
    return password_file(tmp_path, {"alice": "s3cret"})


def test_username_password_from_a_password_file(mqkv, users):
    assert users.read_text().startswith("alice:$argon2id$")
    s = mqkv("--password-file", users)
    good = Paho(s, "alice-1", username="alice", password="s3cret")
    assert good.connack[0] == 0
    bad = Paho(s, "alice-2", username="alice", password="wrong", expect_rc=None)
    assert bad.connack is not None and bad.connack[0] == 0x86
    unknown = Paho(s, "mallory", username="mallory", password="s3cret", expect_rc=None)
    assert unknown.connack is not None and unknown.connack[0] == 0x86
    # The refused connection is closed.
    c = raw(s)
    ack = c.connect("alice-3", username="alice", password=b"nope")
    assert ack.reason == 0x86
    c.wait_closed()


def test_plain_text_passwords_in_the_configuration_are_refused(tmp_path):
    config = tmp_path / "plain.toml"
    config.write_text('[broker]\n[[broker.users]]\nusername = "alice"\npassword = "s3cret"\n')
    res = subprocess.run([MQKV_BIN, "serve", "--listen", "127.0.0.1:0", "--storage", "memory",
                          "-c", str(config)], capture_output=True, timeout=30)
    assert res.returncode != 0
    assert b"mqkv passwd" in res.stderr, res.stderr


def test_mosquitto_passwd_files_are_accepted(mqkv, tmp_path):
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd not installed")
    path = tmp_path / "mosquitto-passwords"
    res = subprocess.run(["mosquitto_passwd", "-c", "-b", str(path), "bob", "b0b-pass"],
                         capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert path.read_text().startswith("bob:$7$")
    s = mqkv("--password-file", path)
    Paho(s, "bob-1", username="bob", password="b0b-pass").disconnect()
    bad = Paho(s, "bob-2", username="bob", password="nope", expect_rc=None)
    assert bad.connack[0] == 0x86


def test_passwd_deletes_and_sighup_reloads_the_password_file(mqkv, tmp_path):
    path = password_file(tmp_path, {"alice": "s3cret", "bob": "other"})
    # Only the signal reads the file again.
    s = mqkv("--password-file", path, "--watch-interval-ms", "0")
    kept = Paho(s, "bob-kept", username="bob", password="other")
    res = subprocess.run([MQKV_BIN, "passwd", "-D", str(path), "bob"], capture_output=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    assert "bob:" not in path.read_text()
    # A second password for alice, and bob gone, once the server is told.
    password_file(tmp_path, {"alice": "n3w"})
    s.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "password file reloaded" in s.stderr_text(), what="the reload")
    Paho(s, "alice-new", username="alice", password="n3w").disconnect()
    old = Paho(s, "alice-old", username="alice", password="s3cret", expect_rc=None)
    assert old.connack[0] == 0x86
    gone = Paho(s, "bob-gone", username="bob", password="other", expect_rc=None)
    assert gone.connack[0] == 0x86
    # Connected clients stay.
    assert kept.subscribe("still/here", 0) == [0]
    # A broken file: the reload fails, says so, and the users in force stay.
    path.write_text("alice:not-a-hash\n")
    s.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "password file reload failed" in s.stderr_text(), what="the failed reload")
    Paho(s, "alice-still", username="alice", password="n3w").disconnect()


def test_repeated_failures_are_answered_more_slowly_and_others_do_not_wait(mqkv, users):
    s = mqkv("--password-file", users)
    times = []
    for i in range(6):
        c = raw(s)
        started = time.monotonic()
        ack = c.connect(f"guess-{i}", username="alice", password=b"guess")
        times.append(time.monotonic() - started)
        assert ack.reason == 0x86
        c.wait_closed()
    # Delays grow after the third failure (100 ms, then 200 ms): not a timing bound, the
    # server's own log says how long it held each refusal.
    text = s.stderr_text()
    assert "delay_ms=100" in text and "delay_ms=200" in text, text[-2000:]
    # Meanwhile a client with the right password connects at once.
    Paho(s, "alice-ok", username="alice", password="s3cret").disconnect()


def test_username_password_v311_return_codes(mqkv, users):
    s = mqkv("--password-file", users)
    ok = raw(s, r.V311).connect("a311", username="alice", password=b"s3cret")
    assert ok.reason == 0
    c = raw(s, r.V311)
    bad = c.connect("b311", username="alice", password=b"wrong")
    assert bad.reason == 0x04, f"3.1.1 bad user name or password is return code 4: {bad!r}"
    c.wait_closed()


def test_anonymous_refused_when_disallowed(mqkv):
    s = mqkv("--allow-anonymous", "false")
    c = raw(s)
    ack = c.connect("anon")
    assert ack.reason == 0x87, f"expected 0x87 Not authorized, got {ack!r}"
    c.wait_closed()


def test_authentication_method_refused(server):
    c = raw(server)
    ack = c.connect("auth-method", props=[(r.AUTHENTICATION_METHOD, "SCRAM-SHA-256"),
                                          (r.AUTHENTICATION_DATA, b"client-first")])
    assert ack.reason == 0x8C, f"expected 0x8C Bad authentication method, got {ack!r}"
    c.wait_closed()
    assert_healthy(server)


# -- session takeover ---------------------------------------------------------------------------


def test_session_takeover_v5(server):
    first = Paho(server, "twin")
    assert first.subscribe("twin/t", 1) == [1]
    second = Paho(server, "twin", clean_start=False)
    assert first.wait_disconnected(5) == 0x8E, (
        f"first connection got reason {first.disconnect_reason!r}, expected 0x8E"
    )
    assert second.session_present is True
    assert not second.disconnected.is_set()
    # The session (and its subscription) now belongs to the second connection.
    pub = Paho(server, "twin-pub")
    pub.publish("twin/t", b"to the new owner", qos=1)
    assert second.get().payload == b"to the new owner"


def test_session_takeover_with_clean_start_discards_session(server):
    first = Paho(server, "twin-clean", properties=props(CONNECT, SessionExpiryInterval=60))
    assert first.subscribe("twinc/t", 1) == [1]
    second = Paho(server, "twin-clean", clean_start=True,
                  properties=props(CONNECT, SessionExpiryInterval=60))
    assert first.wait_disconnected(5) == 0x8E
    assert second.session_present is False
    Paho(server, "twinc-pub").publish("twinc/t", b"x", qos=1)
    second.expect_nothing(0.3)  # the old subscription went with the old session


def test_session_takeover_raw_sees_disconnect_packet(server):
    first = raw_connected(server, "twin-raw")
    raw_connected(server, "twin-raw")
    d = first.expect_disconnect_and_close(5)
    assert d.reason == 0x8E


def test_session_takeover_v311_closes_first(server):
    first = raw_connected(server, "twin311", version=r.V311)
    raw_connected(server, "twin311", version=r.V311)
    assert first.wait_closed(5) == b"", "3.1.1 has no DISCONNECT from the server"


# -- graceful shutdown --------------------------------------------------------------------------


def test_sigterm_sends_disconnect_0x8b_and_exits_0(mqkv):
    s = mqkv()
    c = Paho(s, "bye")
    rc5 = raw_connected(s, "bye-raw")
    old = raw_connected(s, "bye-311", version=r.V311)
    s.proc.send_signal(15)
    assert c.wait_disconnected(5) == 0x8B
    d = rc5.expect_disconnect_and_close(5)
    assert d.reason == 0x8B
    assert old.wait_closed(5) == b""
    rc = s.terminate(10)
    assert rc == 0, f"exit status {rc}"


def test_sigterm_reaches_a_client_that_never_stops_sending(mqkv):
    # Its reads are always ready, so only a shutdown check made before each read reaches it.
    s = mqkv()
    busy = raw_connected(s, "busy")
    packet = r.publish("flood/t", b"x" * 64) * 64
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            try:
                busy.sock.sendall(packet)
            except OSError:
                return

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    try:
        time.sleep(0.3)
        s.proc.send_signal(15)
        d = busy.expect_disconnect_and_close(5)
        assert d.reason == 0x8B
    finally:
        stop.set()
        sender.join(5)
    assert s.terminate(10) == 0


def test_sigterm_with_no_clients_exits_0(mqkv):
    s = mqkv()
    start = time.monotonic()
    assert s.terminate(10) == 0
    assert time.monotonic() - start < 5


def test_sigterm_right_after_listening_line(mqkv):
    # A supervisor (or test) that waits for "listening on" and then stops the server must get
    # the graceful shutdown: the SIGTERM handler has to be in place before the line is printed.
    outcomes = []
    for _ in range(100):
        s = mqkv()
        outcomes.append(s.terminate(10, settle=False))
    killed = [rc for rc in outcomes if rc != 0]
    assert not killed, (
        f"{len(killed)} of 100 servers died from a SIGTERM sent right after 'listening on' "
        f"(exit statuses {sorted(set(killed))}): the handler is installed too late"
    )


def test_many_connections_do_not_break_server(server):
    clients = [raw_connected(server, f"many-{i}") for i in range(50)]
    for c in clients[::2]:
        c.disconnect()
        c.wait_closed()
    wait_for(lambda: server.alive(), 1)
    assert_healthy(server)
    for c in clients[1::2]:
        c.send(r.pingreq())
        assert c.expect(r.PINGRESP).type == r.PINGRESP

