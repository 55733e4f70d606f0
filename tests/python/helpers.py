"""Helpers for the mqkv interop suite: the server process, paho clients with blocking
helpers, raw MQTT connections, polling."""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.reasoncodes import ReasonCode  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

import mqttraw  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MQKV_BIN = os.environ.get("MQKV_BIN", str(REPO / "target" / "debug" / "mqkv"))
HOST = "127.0.0.1"

V5 = mqtt.MQTTv5
V311 = mqtt.MQTTv311


# ---------------------------------------------------------------------------------------------
# Polling
# ---------------------------------------------------------------------------------------------


def wait_for(cond, timeout: float = 5.0, interval: float = 0.02, what: str = "condition"):
    """Polls `cond` until it returns something truthy; returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


MIN_AGE = 0.3


class MqkvServer:
    """One `mqkv serve` process."""

    _counter = 0

    LISTENER_FLAGS = ("--listen-tls", "--listen-ws", "--listen-wss")

    def __init__(self, args, workdir: Path, config: str | None = None, listeners: int = 0,
                 plain: bool = True):
        """`plain`: a plain TCP listener on a free loopback port, besides what `args` and
        `config` give (a `--listen` flag replaces the file's plain listeners)."""
        MqkvServer._counter += 1
        n = MqkvServer._counter
        self.workdir = workdir
        listen = ["--listen", f"{HOST}:0"] if plain else []
        cmd = [MQKV_BIN, "serve", *listen, *map(str, args)]
        if "--storage" not in cmd:
            # Servers of one test share a working directory; the default durable storage
            # would have them fight over ./mqkv-data.
            cmd += ["--storage", "memory"]
        if config is not None:
            path = workdir / f"mqkv-{n}.toml"
            path.write_text(config)
            cmd += ["-c", str(path)]
        self.cmd = cmd
        self.stderr_path = workdir / f"mqkv-{n}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        env = dict(os.environ)
        # Broker debug logs (connections, violations) help when a test fails; the rest at info.
        env.setdefault("RUST_LOG", "info,openraft=warn,mqkv_broker=debug")
        env.setdefault("NO_COLOR", "1")
        env.setdefault("RUST_BACKTRACE", "1")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr, env=env, cwd=workdir
        )
        self.stopped = False
        # One "listening on" line per listener: the plain one, those named by flags, and
        # `listeners` more from the configuration file.
        expected = len(listen) // 2 + sum(1 for a in cmd if a in self.LISTENER_FLAGS) + listeners
        self.listening: list[tuple[str, int]] = []
        self.port = self._read_port()
        while len(self.listening) < expected:
            self._read_port()
        # The HTTP listener (metrics, health), when one is asked for: printed after the others.
        self.http_port = None
        if "--http" in cmd and str(cmd[cmd.index("--http") + 1]) != "off":
            self.http_port = self._read_http()
        # The first listener of each kind: "tcp", "tls", "ws", "wss".
        self.endpoints = {}
        for kind, port in self.listening:
            self.endpoints.setdefault(kind, port)
        self.started_at = time.monotonic()
        self.host = HOST

    def _read_stdout_line(self, prefix: str, what: str) -> str:
        """The rest of the next line on the server's standard output that starts with
        `prefix` (other lines are skipped), read a byte at a time so that nothing after it is
        consumed."""
        deadline = time.monotonic() + 10
        line = b""
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    break
                line += chunk
                if chunk == b"\n":
                    text = line.decode().strip()
                    if text.startswith(prefix):
                        return text.removeprefix(prefix)
                    line = b""
            elif self.proc.poll() is not None:
                break
        self.proc.kill()
        raise RuntimeError(
            f"mqkv did not report {what}: {self.cmd}\nstderr:\n{self.stderr_text()}"
        )

    def _read_port(self) -> int:
        where = self._read_stdout_line("listening on ", "a listener")
        kind, _, addr = where.rpartition("://")
        port = int(addr.split("/", 1)[0].rsplit(":", 1)[1])
        self.listening.append((kind or "tcp", port))
        return port

    def _read_http(self) -> int:
        """The port of the `http on http://ADDR:PORT ...` line."""
        addr = self._read_stdout_line("http on http://", "its HTTP listener").split(" ", 1)[0]
        return int(addr.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_text(self) -> str:
        try:
            self._stderr.flush()
        except ValueError:
            pass
        return self.stderr_path.read_text(errors="replace")

    def stderr_tail(self, n: int = 40) -> str:
        return "\n".join(self.stderr_text().splitlines()[-n:])

    def terminate(self, timeout: float = 10.0, settle: bool = True) -> int:
        """SIGTERM and wait; returns the exit status (kills and fails after `timeout`).

        With `settle`, waits (bounded) until the process has a SIGTERM handler: mqkv prints
        its "listening on" line before it installs the handler, and a SIGTERM in between kills
        it outright (see test_sigterm_right_after_listening_line). Without this, any very
        short test could fail at teardown for that one reason."""
        self.stopped = True
        if settle:
            self.wait_sigterm_handler()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"mqkv did not exit within {timeout}s of SIGTERM")
        finally:
            self._stderr.close()
        return rc

    def handles_sigterm(self) -> bool | None:
        """Whether the process catches SIGTERM (Linux /proc), None if that cannot be told."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("SigCgt:"):
                        return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
        except OSError:
            return None
        return None

    def wait_sigterm_handler(self, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            caught = self.handles_sigterm()
            if caught is None:
                time.sleep(max(0.0, self.started_at + MIN_AGE - time.monotonic()))
                return
            if caught:
                return
            time.sleep(0.005)

    def assert_no_panic(self) -> None:
        text = self.stderr_text()
        assert "panicked" not in text, f"mqkv panicked:\n{self.stderr_tail(60)}"


class Cleanup:
    """Things a test opened that must be closed before its servers stop."""

    def __init__(self):
        self.items = []

    def add(self, item):
        self.items.append(item)
        return item

    def run(self):
        for item in reversed(self.items):
            try:
                item.close()
            except Exception:  # noqa: BLE001 - best effort
                pass
        self.items.clear()


cleanup = Cleanup()


# ---------------------------------------------------------------------------------------------
# Raw clients
# ---------------------------------------------------------------------------------------------


class _RawCleanup:
    """Teardown for a raw connection: a polite DISCONNECT first, so the broker ends the
    connection at once, then close."""

    def __init__(self, c: mqttraw.RawClient):
        self.c = c

    def close(self):
        try:
            self.c.sock.setblocking(False)
            self.c.sock.send(mqttraw.disconnect(0, None, self.c.version))
        except OSError:
            pass
        self.c.close()


def raw(server: MqkvServer, version: int = mqttraw.V5, **kw) -> mqttraw.RawClient:
    """An open TCP connection to the server (nothing sent yet)."""
    c = mqttraw.RawClient(server.host, server.port, version=version, **kw)
    cleanup.add(_RawCleanup(c))
    return c


def raw_connected(server: MqkvServer, client_id: str = "", version: int = mqttraw.V5,
                  rcvbuf: int | None = None, **connect_kw) -> mqttraw.RawClient:
    """A raw client that completed CONNECT with reason 0."""
    c = raw(server, version, rcvbuf=rcvbuf)
    ack = c.connect(client_id, **connect_kw)
    assert ack.reason == 0, f"CONNACK {ack!r}"
    c.connack = ack
    return c


# ---------------------------------------------------------------------------------------------
# paho clients
# ---------------------------------------------------------------------------------------------


def props(packet_type, **values) -> Properties:
    """paho Properties for a packet type, e.g. props(PacketTypes.PUBLISH, ContentType="x")."""
    p = Properties(packet_type)
    for k, v in values.items():
        setattr(p, k, v)
    return p


def prop(properties, name, default=None):
    """A property of a received packet, or `default` when absent."""
    if properties is None:
        return default
    return getattr(properties, name, default)


class Paho:
    """A paho-mqtt client running its network loop in a thread, with blocking helpers.

    Automatic reconnection is off: a test sees every disconnect exactly as it happened.
    """

    def __init__(
        self,
        server: MqkvServer,
        client_id: str = "",
        *,
        version: int = V5,
        clean_start: bool = True,
        properties: Properties | None = None,
        will: dict | None = None,
        username: str | None = None,
        password: str | None = None,
        keepalive: int = 60,
        expect_rc: int | None = 0,
        timeout: float = 5.0,
        manual_ack: bool = False,
        max_inflight: int | None = None,
        listener: str = "tcp",
        tls: dict | None = None,
        ws_path: str = "/mqtt",
        ws_headers: dict | None = None,
        port: int | None = None,
    ):
        """`listener` picks the server's listener by kind ("tcp", "tls", "ws", "wss");
        `tls` holds paho's `tls_set` arguments (ca_certs, certfile, keyfile) for the TLS
        ones; `ws_headers`, extra headers of the WebSocket upgrade. `port` connects elsewhere
        (a proxy in front of that listener) with the listener's transport."""
        self.server = server
        self.version = version
        kw = {}
        if version != V5:
            kw["clean_session"] = clean_start
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=version,
            reconnect_on_failure=False,
            manual_ack=manual_ack,
            transport="websockets" if listener in ("ws", "wss") else "tcp",
            **kw,
        )
        if listener in ("ws", "wss"):
            self.client.ws_set_options(path=ws_path, headers=ws_headers)
        if listener in ("tls", "wss"):
            self.client.tls_set(**(tls or {}))
        if max_inflight is not None:
            self.client.max_inflight_messages_set(max_inflight)
            self.client.max_queued_messages_set(0)
        self.lock = threading.Lock()
        self.messages: queue.Queue = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack = None  # (reason code int, session_present, properties)
        self.disconnect_reason = None
        self.disconnect_properties = None
        self.acks: dict = {}  # mid -> (kind, reason codes, properties)
        self.published: dict = {}  # mid -> reason code int
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.client.on_publish = self._on_publish
        if will is not None:
            self.client.will_set(**will)
        if username is not None:
            self.client.username_pw_set(username, password)
        # Every write happens on the loop thread below. With no write callback registered,
        # paho writes a packet queued from another thread (a publish from the test) in that
        # thread, while the loop thread may be writing too; over WebSocket that interleaves
        # frames. With one, paho only queues the packet and wakes the loop thread.
        self.client.on_socket_register_write = lambda *_: None
        cleanup.add(self)
        ckw = {}
        if version == V5:
            ckw["clean_start"] = clean_start
            ckw["properties"] = properties
        port = port or server.endpoints[listener]
        self.client.connect(server.host, port, keepalive, **ckw)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"paho-{client_id or 'anon'}")
        self._thread.start()
        wait_for(lambda: self.connack is not None or self.disconnected.is_set(), timeout,
                 what="CONNACK")
        if expect_rc is not None:
            assert self.connack is not None, "connection closed without CONNACK"
            assert self.connack[0] == expect_rc, (
                f"CONNACK reason {self.connack[0]:#x}, expected {expect_rc:#x}"
            )

    def _loop(self):
        # paho's own loop thread waits up to 1 s in select before it notices loop_stop(); a
        # short loop timeout keeps teardown and disconnects fast. No reconnection.
        while not self._stop.is_set():
            rc = self.client.loop(timeout=0.05)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                self.disconnected.set()
                return

    def loop_stop(self):
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)

    # -- callbacks -----------------------------------------------------------------------------

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        self.connack = (reason_code.value, flags.session_present, properties)
        if reason_code.value == 0:
            self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnect_reason = reason_code.value if reason_code is not None else None
        self.disconnect_properties = properties
        self.disconnected.set()

    def _on_message(self, client, userdata, msg):
        self.messages.put(msg)

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        with self.lock:
            self.acks[mid] = ("suback", [rc.value for rc in reason_codes], properties)

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties):
        with self.lock:
            codes = [rc.value for rc in reason_codes] if isinstance(reason_codes, list) else []
            self.acks[mid] = ("unsuback", codes, properties)

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        with self.lock:
            self.published[mid] = reason_code.value if reason_code is not None else 0

    # -- accessors -----------------------------------------------------------------------------

    @property
    def session_present(self) -> bool:
        return self.connack[1]

    @property
    def connack_props(self):
        return self.connack[2]

    def _wait_ack(self, mid, timeout):
        wait_for(lambda: mid in self.acks, timeout, what=f"ack for mid {mid}")
        with self.lock:
            return self.acks.pop(mid)

    # -- operations ----------------------------------------------------------------------------

    def subscribe(self, topic, qos: int = 0, *, options: SubscribeOptions | None = None,
                  properties: Properties | None = None, timeout: float = 5.0) -> list[int]:
        """Subscribes and returns the SUBACK reason codes (ints)."""
        if isinstance(topic, list):
            rc, mid = self.client.subscribe(topic, properties=properties)
        elif self.version == V5:
            rc, mid = self.client.subscribe(
                topic, options=options or SubscribeOptions(qos=qos), properties=properties
            )
        else:
            rc, mid = self.client.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS, f"subscribe failed locally: {rc}"
        return self._wait_ack(mid, timeout)[1]

    def unsubscribe(self, topic, timeout: float = 5.0) -> list[int]:
        rc, mid = self.client.unsubscribe(topic)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait_ack(mid, timeout)[1]

    def publish(self, topic, payload=b"", qos: int = 0, retain: bool = False,
                properties: Properties | None = None, wait: bool = True,
                timeout: float = 5.0):
        """Publishes; with `wait`, waits for the acknowledgement flow to complete and returns
        the PUBACK/PUBREC reason code (0 for QoS 0)."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish failed locally: {info.rc}"
        if not wait:
            return info
        info.wait_for_publish(timeout)
        assert info.is_published(), f"publish to {topic!r} not acknowledged in {timeout}s"
        with self.lock:
            return self.published.get(info.mid, 0)

    def get(self, timeout: float = 5.0):
        """The next received message (paho MQTTMessage); fails on timeout."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message received within {timeout}s") from None

    def collect(self, n: int, timeout: float = 5.0) -> list:
        """Exactly the next `n` messages (fails if fewer arrive in time)."""
        deadline = time.monotonic() + timeout
        out = []
        while len(out) < n:
            left = deadline - time.monotonic()
            try:
                out.append(self.messages.get(timeout=max(0.001, left)))
            except queue.Empty:
                raise AssertionError(
                    f"received {len(out)} of {n} messages within {timeout}s: "
                    f"{[m.payload[:40] for m in out]!r}"
                ) from None
        return out

    def drain(self, quiet: float = 0.5) -> list:
        """Every message that arrives until none has for `quiet` seconds."""
        out = []
        while True:
            try:
                out.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                return out

    def expect_nothing(self, within: float = 0.5) -> None:
        try:
            m = self.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(
            f"unexpected message on {m.topic!r}: {m.payload!r} (retain={m.retain})"
        )

    def disconnect(self, reason: int = 0, properties: Properties | None = None) -> None:
        """Sends DISCONNECT and returns once the broker has closed the connection.

        paho closes its socket right after writing DISCONNECT, so a test reconnecting with the
        same client id at once could race the broker still handling the old connection. Here
        the network loop is stopped, anything paho still has queued (acks) is flushed, the
        DISCONNECT is written on paho's socket, and the socket is read until the broker closes
        it: by then the broker has handled the DISCONNECT."""
        if self.disconnected.is_set():
            self.loop_stop()
            return
        self.loop_stop()
        while self.client.want_write():
            if self.client.loop_write() != mqtt.MQTT_ERR_SUCCESS:
                break
        if self.version == V5:
            body = bytes([reason]) + (properties.pack() if properties is not None else b"\x00")
            packet = mqttraw.packet(0xE0, body)
        else:
            packet = b"\xe0\x00"
        sock = self.client.socket()
        try:
            sock.setblocking(True)
            # Over WebSocket paho's socket is a wrapper that frames what it sends: the
            # timeout goes on the socket underneath.
            getattr(sock, "_socket", sock).settimeout(5)
            if hasattr(sock, "sendall"):
                sock.sendall(packet)
            else:
                sent = 0
                while sent < len(packet):
                    sent += sock.send(packet[sent:])
            deadline = time.monotonic() + 5
            while True:
                try:
                    if not sock.recv(65536):
                        break
                except (ConnectionResetError, BrokenPipeError):
                    break
                except BlockingIOError:
                    # paho's WebSocket wrapper, on a frame that carries no MQTT bytes (the
                    # broker's close frame, answered by the wrapper).
                    pass
                except OSError:
                    raise AssertionError("broker did not close the connection after DISCONNECT")
                if time.monotonic() > deadline:
                    raise AssertionError("broker did not close the connection after DISCONNECT")
        finally:
            sock.close()
            self.disconnected.set()

    def wait_disconnected(self, timeout: float = 5.0):
        assert self.disconnected.wait(timeout), f"not disconnected within {timeout}s"
        return self.disconnect_reason

    def close(self) -> None:
        """Ends the connection at test teardown: DISCONNECT (wakes the network loop at once),
        then stops the loop and closes the socket."""
        try:
            if not self.disconnected.is_set():
                self.client.disconnect()
            self.loop_stop()
        finally:
            sock = self.client.socket()
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass


def sub_opts(qos=0, no_local=False, retain_as_published=False, retain_handling=0):
    return SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=retain_as_published,
                            retainHandling=retain_handling)


def assert_healthy(server: MqkvServer) -> None:
    """The server still serves a fresh client: connect, subscribe, publish QoS 1, receive."""
    assert server.alive(), f"server died:\n{server.stderr_tail()}"
    sub = Paho(server, "healthcheck-sub")
    assert sub.subscribe("health/check", 1) == [1]
    pub = Paho(server, "healthcheck-pub")
    pub.publish("health/check", b"ok", qos=1)
    m = sub.get(5)
    assert (m.topic, m.payload) == ("health/check", b"ok")
    pub.disconnect()
    sub.disconnect()
    assert server.alive()


__all__ = [
    "Paho", "PacketTypes", "Properties", "ReasonCode", "SubscribeOptions", "V5", "V311",
    "assert_healthy", "mqttraw", "props", "prop", "raw", "raw_connected", "sub_opts",
    "wait_for", "MqkvServer", "HOST", "MQKV_BIN",
]


# ---------------------------------------------------------------------------------------------
# Command-line clients (mosquitto-clients)
# ---------------------------------------------------------------------------------------------


class Proc:
    """A command-line client run in the background, its output (stdout and stderr merged)
    collected line by line by a thread. stdio is line-buffered through `stdbuf`."""

    def __init__(self, args: list[str]):
        self.args = args
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "-eL", *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        cleanup.add(self)

    def _read(self):
        for raw_line in self.proc.stdout:
            with self.cond:
                self.lines.append(raw_line.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pred, timeout: float = 5.0, start: int = 0) -> str:
        """The first output line (from index `start`) for which `pred(line)` is true."""
        if isinstance(pred, str):
            text = pred
            pred = lambda line: text in line  # noqa: E731
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines[start:]:
                    if pred(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{self.args[0]}: no matching line within {timeout}s; output:\n"
                        + "\n".join(self.lines[-30:])
                    )
                self.cond.wait(left)

    def wait(self, timeout: float = 10.0) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.args[0]} still running after {timeout}s; output:\n" + self.output()
            ) from None
        self.thread.join(2)
        return rc

    def output(self) -> str:
        with self.cond:
            return "\n".join(self.lines)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run(args: list[str], timeout: float = 15.0) -> subprocess.CompletedProcess:
    """Runs a command-line client to completion."""
    return subprocess.run(args, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
