"""Listeners behind a load balancer or reverse proxy. HAProxy in front, sending the PROXY
protocol (version 1 and 2) ahead of plain MQTT, TLS and WebSocket; nginx in front of a
WebSocket listener, adding X-Forwarded-For. The client's address taken from the header for
logs, per-address limits and the loopback-only rule for anonymous clients; headers refused
from proxies that are not listed, and connections without one."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time

import pytest

from certs import make_pki
from helpers import HOST, MQKV_BIN, Paho, assert_healthy, run, wait_for
from mqttraw import CONNACK, Closed, RawClient, connect
from test_cluster import free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
needs_haproxy = pytest.mark.skipif(
    not shutil.which("haproxy") and not shutil.which("/usr/sbin/haproxy"),
    reason="haproxy not installed (apt-get install haproxy)",
)

NOT_AUTHORIZED = 0x87
QUOTA_EXCEEDED = 0x97


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def listeners(*tables: str) -> str:
    return "\n".join(f"[[listeners]]\n{t}\n" for t in tables)


def proxied(mqkv, *tables: str, extra: str = ""):
    """A server with a plain listener (for the test's direct clients) and the listeners of the
    `[[listeners]]` tables `tables`."""
    config = f'listen = ["{HOST}:0"]\n' + extra + listeners(*tables)
    return mqkv(config=config, listeners=1 + len(tables), plain=False)


def behind(server, kind: str) -> list[int]:
    """The ports of the server's listeners of `kind` that take the PROXY protocol."""
    ports = [port for k, port in server.listening if k == kind]
    return ports[1:] if kind == "tcp" else ports


def accepts(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.2).close()
        return True
    except OSError:
        return False


class Background:
    """A program the test runs in the background, its output in a log file."""

    def __init__(self, args: list[str], log):
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def background():
    """Factory: `background(Kind, *args)` starts one, stopped at the end of the test."""
    started = []

    def start(kind, *args):
        b = kind(*args)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


class HAProxy(Background):
    """HAProxy in TCP mode, one frontend per (port, backend port, send-proxy option)."""

    def __init__(self, tmp_path, routes: list[tuple[int, int, str]]):
        cfg = ["global", "  maxconn 256", "defaults", "  mode tcp", "  timeout connect 5s",
               "  timeout client 60s", "  timeout server 60s"]
        for i, (front, back, option) in enumerate(routes):
            cfg += [f"frontend f{i}", f"  bind {HOST}:{front}", f"  default_backend b{i}",
                    f"backend b{i}", f"  server mqkv {HOST}:{back} {option}"]
        path = tmp_path / "haproxy.cfg"
        path.write_text("\n".join(cfg) + "\n")
        super().__init__([HAPROXY, "-db", "-f", str(path)], tmp_path / "haproxy.log")
        for front, _, _ in routes:
            wait_for(lambda: accepts(front), what=f"haproxy on {front}")


@pytest.fixture
def haproxy(tmp_path, background):
    return lambda routes: background(HAProxy, tmp_path, routes)


def seen_from(server, client: Paho) -> bool:
    """Whether the server logged the client's own address (its side of the connection to the
    proxy) as the peer of a connection."""
    sock = client.client.socket()
    # Over WebSocket paho wraps the socket.
    host, port = getattr(sock, "_socket", sock).getsockname()[:2]
    return f"peer={host}:{port} " in server.stderr_text()


@needs_haproxy
@pytest.mark.parametrize("option", ["send-proxy", "send-proxy-v2"])
@pytest.mark.parametrize("kind", ["tcp", "tls", "ws", "wss"])
def test_clients_behind_haproxy_are_seen_where_they_are(mqkv, pki, haproxy, option, kind):
    tls = f'cert = "{pki.server.cert_path}"\nkey = "{pki.server.key_path}"\n' \
        if kind in ("tls", "wss") else ""
    server = proxied(mqkv, f'kind = "{kind}"\naddress = "{HOST}:0"\nproxy_protocol = true\n{tls}')
    front = free_port()
    haproxy([(front, behind(server, kind)[0], option)])
    trust = {"ca_certs": str(pki.ca.cert_path)}
    sub = Paho(server, "sub", listener=kind, port=front, tls=trust)
    assert sub.subscribe("behind/#", 1) == [1]
    pub = Paho(server, "pub", listener=kind, port=front, tls=trust)
    pub.publish("behind/haproxy", b"through the proxy", qos=1)
    assert sub.get(5).payload == b"through the proxy"
    # The server saw each client at its own address, not at the proxy's side.
    wait_for(lambda: seen_from(server, sub) and seen_from(server, pub), what="the clients' addresses")
    # A connection straight to the listener, without a header, is refused; the server goes on.
    raw = RawClient(HOST, behind(server, kind)[0])
    with pytest.raises((Closed, OSError)):
        raw.connect("direct")
    wait_for(lambda: "no PROXY protocol header" in server.stderr_text(), what="the log line")
    Paho(server, "after", listener=kind, port=front, tls=trust).disconnect()
    assert_healthy(server)


def with_header(port: int, header: bytes, client_id: str) -> RawClient:
    c = RawClient(HOST, port)
    c.send(header + connect(client_id))
    return c


def test_the_header_decides_who_is_local_and_whose_address_counts(mqkv):
    server = proxied(mqkv, f'kind = "tcp"\naddress = "{HOST}:0"\nproxy_protocol = true\n',
                     extra="[broker]\nmax_connections_per_address = 1\n")
    port = behind(server, "tcp")[0]
    # Anonymous clients only where they connected to a loopback address: a client of the
    # proxy's public address is not local, one of its loopback address is.
    public = with_header(port, b"PROXY TCP4 203.0.113.7 192.0.2.1 51000 1883\r\n", "public")
    assert public.expect(CONNACK).reason == NOT_AUTHORIZED
    local = with_header(port, b"PROXY TCP4 127.0.0.1 127.0.0.1 51001 1883\r\n", "local")
    assert local.expect(CONNACK).reason == 0
    # One connection per client address: two clients behind the same proxy are two
    # addresses; a second connection from one of them is one too many.
    v2 = bytes.fromhex("0d0a0d0a000d0a515549540a") + bytes([0x21, 0x11, 0, 12]) \
        + bytes([127, 0, 0, 9, 127, 0, 0, 1]) + (51002).to_bytes(2, "big") \
        + (1883).to_bytes(2, "big")
    other = with_header(port, v2, "other")
    assert other.expect(CONNACK).reason == 0
    again = with_header(port, v2, "other-again")
    assert again.expect(CONNACK).reason == QUOTA_EXCEEDED
    assert "peer=127.0.0.9:51002" in server.stderr_text()
    # The proxy's own health check (LOCAL) counts as the connection it is: from 127.0.0.1,
    # where `local` (whose header named 127.0.0.1) is already connected.
    health = with_header(port, bytes.fromhex("0d0a0d0a000d0a515549540a") + bytes([0x20, 0, 0, 0]),
                         "health")
    assert health.expect(CONNACK).reason == QUOTA_EXCEEDED
    assert f"peer=127.0.0.1:{health.sock.getsockname()[1]} " in server.stderr_text()
    assert server.alive()


@pytest.mark.parametrize("header, logged", [
    (b"", "no PROXY protocol header"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "malformed PROXY protocol header"),
    (b"PROXY TCP4 " + b"1" * 120, "PROXY protocol header longer than 107 bytes"),
    (bytes.fromhex("0d0a0d0a000d0a515549540a") + bytes([0x21, 0x11, 0xff, 0xff]),
     "PROXY protocol header longer than"),
])
def test_bad_headers_are_refused_and_nobody_else_notices(mqkv, header, logged):
    server = proxied(mqkv, f'kind = "tcp"\naddress = "{HOST}:0"\nproxy_protocol = true\n')
    port = behind(server, "tcp")[0]
    good = with_header(port, b"PROXY TCP4 127.0.0.1 127.0.0.1 5 1883\r\n", "good")
    assert good.expect(CONNACK).reason == 0
    bad = with_header(port, header, "bad")
    with pytest.raises((Closed, OSError)):
        bad.expect(CONNACK)
    wait_for(lambda: logged in server.stderr_text(), what=logged)
    good.publish("still/here", b"x", qos=0)
    assert_healthy(server)


def test_a_stalled_header_is_given_up_on(mqkv):
    server = proxied(mqkv, f'kind = "tcp"\naddress = "{HOST}:0"\nproxy_protocol = true\n')
    port = behind(server, "tcp")[0]
    stalled = RawClient(HOST, port, timeout=15)
    stalled.send(b"PROXY TCP4 1.2.3.4")
    started = time.monotonic()
    with pytest.raises((Closed, OSError)):
        stalled.expect(CONNACK)
    assert time.monotonic() - started < 14
    wait_for(lambda: "PROXY protocol header not received in time" in server.stderr_text(),
             what="the log line")


def test_only_listed_proxies_may_send_headers(mqkv):
    server = proxied(
        mqkv,
        f'kind = "tcp"\naddress = "{HOST}:0"\nproxy_protocol = true\nproxy_from = ["10.0.0.0/8"]\n',
        f'kind = "tcp"\naddress = "{HOST}:0"\nproxy_protocol = true\nproxy_from = ["127.0.0.1"]\n',
    )
    closed, listed = behind(server, "tcp")
    refused = with_header(closed, b"PROXY TCP4 127.0.0.1 127.0.0.1 5 1883\r\n", "refused")
    with pytest.raises((Closed, OSError)):
        refused.expect(CONNACK)
    wait_for(lambda: "not from a proxy the listener trusts" in server.stderr_text(),
             what="the log line")
    taken = with_header(listed, b"PROXY TCP4 127.0.0.1 127.0.0.1 5 1883\r\n", "taken")
    assert taken.expect(CONNACK).reason == 0


def test_proxy_settings_are_checked_at_start(mqkv, tmp_path):
    cases = [
        ('kind = "tcp"\naddress = "127.0.0.1:0"\nproxy_from = ["10.0.0.0/8"]\n',
         "proxy_from is for listeners with proxy_protocol"),
        ('kind = "tcp"\naddress = "127.0.0.1:0"\nproxy_protocol = true\nproxy_from = ["lb"]\n',
         '"lb" is not an address or network'),
    ]
    for i, (table, message) in enumerate(cases):
        path = tmp_path / f"bad-{i}.toml"
        path.write_text(listeners(table))
        res = run([MQKV_BIN, "serve", "--storage", "memory", "--http", "off", "-c", str(path)])
        assert res.returncode != 0
        assert message in res.stderr.decode(), res.stderr
    # One that takes headers from anyone on a public address is warned about.
    server = proxied(mqkv, 'kind = "tcp"\naddress = "0.0.0.0:0"\nproxy_protocol = true\n',
                     'kind = "ws"\naddress = "0.0.0.0:0"\nforwarded_header = "X-Forwarded-For"\n')
    assert re.search(r"WARN.*PROXY protocol listener that takes headers from anyone",
                     server.stderr_text())
    assert re.search(r"WARN.*takes a forwarding header from anyone",
                     server.stderr_text())


# ---------------------------------------------------------------------------------------------
# WebSocket behind an HTTP reverse proxy: X-Forwarded-For and Forwarded
# ---------------------------------------------------------------------------------------------

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
needs_nginx = pytest.mark.skipif(
    not shutil.which("nginx") and not shutil.which("/usr/sbin/nginx"),
    reason="nginx not installed (apt-get install nginx)",
)
# The address nginx connects to mqkv from, and that the listeners below trust.
PROXY_ADDR = "127.0.0.5"


class Nginx(Background):
    """nginx forwarding WebSocket upgrades on `front` to the listener on `back`, from
    PROXY_ADDR, adding the client's address to X-Forwarded-For as its documentation shows."""

    def __init__(self, tmp_path, front: int, back: int):
        d = tmp_path / "nginx"
        d.mkdir()
        temp = " ".join(f"{k}_temp_path {d / k};" for k in
                        ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        (d / "nginx.conf").write_text(f"""
daemon off;
pid {d / "nginx.pid"};
error_log {d / "error.log"} info;
events {{ worker_connections 64; }}
http {{
  access_log off;
  {temp}
  server {{
    listen {HOST}:{front};
    location /mqtt {{
      proxy_pass http://{HOST}:{back};
      proxy_bind {PROXY_ADDR};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_read_timeout 300s;
    }}
  }}
}}
""")
        super().__init__([NGINX, "-p", str(d), "-c", str(d / "nginx.conf"),
                          "-e", str(d / "error.log")], d / "stdout.log")
        wait_for(lambda: accepts(front), what="nginx")


@pytest.fixture
def nginx(tmp_path, background):
    return lambda front, back: background(Nginx, tmp_path, front, back)


def forwarding(mqkv, proxy_from: str, extra: str = ""):
    return proxied(mqkv, f'kind = "ws"\naddress = "{HOST}:0"\nforwarded_header = "X-Forwarded-For"\n'
                         f'proxy_from = [{proxy_from}]\n', extra=extra)


@needs_nginx
def test_websocket_clients_behind_nginx_are_seen_where_they_are(mqkv, nginx):
    server = forwarding(mqkv, f'"{PROXY_ADDR}"')
    front = free_port()
    nginx(front, behind(server, "ws")[0])
    # What a client writes in X-Forwarded-For itself is not taken: nginx appends the address
    # it took the request from, the last one nginx's address does not vouch for. A Forwarded
    # header, which nginx passes on as it is, is not read at all.
    spoofed = {"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=198.51.100.1"}
    sub = Paho(server, "sub", listener="ws", port=front)
    assert sub.subscribe("behind/#", 1) == [1]
    pub = Paho(server, "pub", listener="ws", port=front, ws_headers=spoofed)
    pub.publish("behind/nginx", b"through nginx", qos=1)
    assert sub.get(5).payload == b"through nginx"
    lines = [line for line in server.stderr_text().splitlines()
             if "client behind a WebSocket proxy" in line]
    assert len(lines) == 2, lines
    for line in lines:
        assert f"proxy={PROXY_ADDR}:" in line and "client=127.0.0.1:0" in line, line
    assert_healthy(server)


@needs_nginx
def test_a_chain_of_trusted_proxies_is_walked_back_to_the_client(mqkv, nginx, tmp_path):
    """Trusting every loopback address as a proxy, the client nginx saw (127.0.0.1) is a proxy
    too, so the address it forwarded (203.0.113.7) is the client: not local, so anonymous
    clients are refused, and one that logs in is in."""
    from test_connect import password_file

    users = password_file(tmp_path, {"alice": "s3cret"})
    server = forwarding(mqkv, '"127.0.0.0/8"', extra=f'password_file = "{users}"\n')
    front = free_port()
    nginx(front, behind(server, "ws")[0])
    behind_cdn = {"X-Forwarded-For": "203.0.113.7"}
    refused = Paho(server, "anonymous", listener="ws", port=front, ws_headers=behind_cdn,
                   expect_rc=NOT_AUTHORIZED)
    alice = Paho(server, "alice", listener="ws", port=front, ws_headers=behind_cdn,
                 username="alice", password="s3cret")
    alice.disconnect()
    assert "client=203.0.113.7:0" in server.stderr_text()
    # Without the header, the client is the one nginx saw, on loopback: local.
    Paho(server, "local", listener="ws", port=front).disconnect()
    refused.close()


def upgrade_from_proxy(server, headers: str, source: str = PROXY_ADDR):
    from test_transports import RawWs

    return RawWs(behind(server, "ws")[0], extra_headers=headers, source=source)


def test_forwarded_addresses_count_against_the_per_address_limit(mqkv):
    from test_transports import connect_packet

    server = forwarding(mqkv, f'"{PROXY_ADDR}"',
                        extra="[broker]\nmax_connections_per_address = 1\nallow_anonymous = true\n")
    codes = []
    clients = []
    # Each connects before the next one opens: the limit is counted at the upgrade.
    for i, xff in enumerate(["198.51.100.1", "[2001:db8::2]:4711", "198.51.100.1:9"]):
        ws = upgrade_from_proxy(server, f"X-Forwarded-For: {xff}\r\n")
        assert ws.status() == 101
        ws.send_frame(connect_packet(f"c{i}"))
        codes.append(ws.recv_mqtt()[3])
        clients.append(ws)
    assert codes == [0, 0, QUOTA_EXCEEDED]
    assert "client=[2001:db8::2]:4711" in server.stderr_text()


@pytest.mark.parametrize("headers, source, status", [
    ("X-Forwarded-For: 198.51.100.1\r\n", HOST, 400),  # not from the listed proxy
    ("", PROXY_ADDR, 400),  # no header
    ("X-Forwarded-For: unknown\r\n", PROXY_ADDR, 400),
    ("X-Forwarded-For: _hidden\r\n", PROXY_ADDR, 400),
    ("Forwarded: for=198.51.100.1\r\n", PROXY_ADDR, 400),  # not the header it reads
])
def test_upgrades_that_do_not_name_a_client_are_refused(mqkv, headers, source, status):
    server = forwarding(mqkv, f'"{PROXY_ADDR}"')
    ws = upgrade_from_proxy(server, headers, source=source)
    assert ws.status() == status
    ws.close()
    wait_for(lambda: "connection refused" in server.stderr_text(), what="the log line")
    assert_healthy(server)
