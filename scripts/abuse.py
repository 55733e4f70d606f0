#!/usr/bin/env python3
"""Hostile and careless clients against a real `mqkv serve`, with its memory sampled.

Each phase floods the server one way, holds the flood while memory is sampled, lets go, and
waits for memory to settle. A well-behaved client publishes to itself and makes a state store
request every 200 ms throughout; its round trips are part of the report. The server's resident
memory (VmRSS) is read once a second.

    python3 scripts/abuse.py                       # every phase at 10x the base sizes
    python3 scripts/abuse.py --scale 1 --phases partial,watches

Base sizes (multiplied by --scale): 200 connections announcing 16 MB publishes and sending
1 kB; 3,000 slowloris connections; 200,000 watch registrations; 200,000 retained messages of
1 kB; 5,000 persistent sessions with 100 messages of 1 kB published to all of them; 10
subscribers that never read while 20,000 messages of 1 kB are published; a storm of garbage
connections (random bytes, mutated CONNECTs, persistent sessions with wills) for --storm-secs.

The server binary comes from --bin (default target/release/mqkv), with default settings on a
fresh data directory. Writes `abuse.json` (every sample and outcome) and prints a table.
Needs the Python packages of tests/python/requirements.txt; run as root for more than about
20,000 simultaneous connections (the open-file limit is raised as far as allowed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

import mqttraw as m  # noqa: E402
from statestore import REQUEST_TOPIC, resp3  # noqa: E402

MIB = 1024 * 1024
KB = b"x" * 1024


# ---------------------------------------------------------------------------------------------
# The server and its memory
# ---------------------------------------------------------------------------------------------


class Server:
    def __init__(self, binary: str, workdir: Path, extra: list[str]):
        self.log = open(workdir / "server.log", "wb")
        env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        cmd = [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir",
               str(workdir / "data"), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, env=env)
        line = self.proc.stdout.readline().decode()
        self.port = int(line.strip().rsplit(":", 1)[1])

    def rss(self) -> int | None:
        try:
            for line in open(f"/proc/{self.proc.pid}/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Attached(Server):
    """A server started elsewhere (for example under a profiler): its port and process id."""

    def __init__(self, port: int, pid: int):
        self.port = port
        self.proc = argparse.Namespace(pid=pid)

    def alive(self) -> bool:
        return Path(f"/proc/{self.proc.pid}").exists()

    def stop(self) -> None:
        return None


class Sampler(threading.Thread):
    """Reads the server's resident memory once a second, labelled with the current phase."""

    def __init__(self, server: Server):
        super().__init__(daemon=True)
        self.server = server
        self.phase = "start"
        self.samples: list[tuple[float, str, int]] = []
        self.start_time = time.monotonic()
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(1.0):
            rss = self.server.rss()
            if rss is not None:
                self.samples.append((time.monotonic() - self.start_time, self.phase, rss))

    def now(self) -> int:
        return self.server.rss() or 0

    def peak(self, phase: str) -> int:
        return max((r for _, p, r in self.samples if p == phase), default=0)


class GoodClient(threading.Thread):
    """Publishes to itself at QoS 1 and sets a key every 200 ms; records each round trip."""

    def __init__(self, port: int, sampler: Sampler):
        super().__init__(daemon=True)
        self.port = port
        self.sampler = sampler
        self.rtts: dict[str, list[float]] = {}
        self.failures: dict[str, int] = {}
        self.done = threading.Event()

    def _session(self):
        c = m.RawClient("127.0.0.1", self.port, timeout=10)
        ack = c.connect("abuse-good-client", keep_alive=30)
        assert ack.reason == 0, ack
        c.subscribe(1, [("abuse-good/echo", 1), ("abuse-good/response", 1)])
        return c

    def _round_trip(self, c: m.RawClient, n: int) -> None:
        c.publish("abuse-good/echo", b"%d" % n, qos=1, packet_id=1 + n % 60000)
        corr = uuid.uuid4().bytes
        props = [(m.RESPONSE_TOPIC, "abuse-good/response"), (m.CORRELATION_DATA, corr),
                 (m.USER_PROPERTY, ("__ts", f"{int(time.time() * 1000):015d}:00000:good"))]
        c.publish(REQUEST_TOPIC, resp3("SET", "abuse-good-key", str(n)), props=props)
        echoed = answered = False
        deadline = time.monotonic() + 10
        while not (echoed and answered):
            p = c.recv_packet(max(0.01, deadline - time.monotonic()))
            if p.type == m.PUBLISH:
                if p.qos:
                    c.send(m.ack(m.PUBACK, p.packet_id))
                if p.topic == "abuse-good/echo" and p.payload == b"%d" % n:
                    echoed = True
                elif p.topic == "abuse-good/response" and p.prop(m.CORRELATION_DATA) == corr:
                    assert p.payload.startswith(b"+OK"), p.payload
                    answered = True

    def run(self):
        n, c = 0, None
        while not self.done.is_set():
            phase = self.sampler.phase
            start = time.monotonic()
            try:
                if c is None:
                    c = self._session()
                self._round_trip(c, n)
                self.rtts.setdefault(phase, []).append(time.monotonic() - start)
            except Exception:  # noqa: BLE001 - any failure counts, then reconnect
                self.failures[phase] = self.failures.get(phase, 0) + 1
                if c is not None:
                    c.close()
                c = None
            n += 1
            self.done.wait(max(0.0, 0.2 - (time.monotonic() - start)))
        if c is not None:
            c.close()


# ---------------------------------------------------------------------------------------------
# Asynchronous raw connections
# ---------------------------------------------------------------------------------------------


class Conn:
    """One raw MQTT connection on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> "Conn":
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def packet(self, timeout: float = 30.0) -> m.Packet:
        async def read() -> m.Packet:
            first = (await self.reader.readexactly(1))[0]
            length, shift = 0, 0
            while True:
                b = (await self.reader.readexactly(1))[0]
                length |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            return m.decode(first, await self.reader.readexactly(length))
        return await asyncio.wait_for(read(), timeout)

    async def connect(self, client_id: str, **kw) -> m.Packet:
        await self.send(m.connect(client_id, **kw))
        while True:
            p = await self.packet()
            if p.type == m.CONNACK:
                return p

    async def subscribe(self, filters: list[tuple[str, int]]) -> m.Packet:
        """Sends SUBSCRIBE and returns the SUBACK (other packets read meanwhile are dropped)."""
        await self.send(m.subscribe(1, filters))
        while True:
            p = await self.packet()
            if p.type == m.SUBACK:
                return p

    async def closed_by_server(self, timeout: float) -> bool:
        """Whether the server closes the connection within `timeout` (input is discarded)."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
            return True
        except (TimeoutError, asyncio.TimeoutError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        try:
            self.writer.transport.abort()
        except Exception:  # noqa: BLE001
            pass


async def gather_limited(n: int, limit: int, make) -> list:
    """Runs `make(i)` for i in 0..n, at most `limit` at a time; returns their results."""
    sem = asyncio.Semaphore(limit)

    async def one(i):
        async with sem:
            try:
                return await make(i)
            except Exception as e:  # noqa: BLE001
                return e

    return await asyncio.gather(*(one(i) for i in range(n)))


def count_errors(results: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        if isinstance(r, Exception):
            out[type(r).__name__] = out.get(type(r).__name__, 0) + 1
    return out


# ---------------------------------------------------------------------------------------------
# Phases: each returns (a summary of what the server did, a coroutine that lets go)
# ---------------------------------------------------------------------------------------------


async def end_sessions(port: int, client_ids: list[str]) -> None:
    """Ends kept sessions: a clean start with no expiry, then DISCONNECT."""

    async def end(i):
        c = await Conn.open(port)
        try:
            await c.connect(client_ids[i], clean_start=True)
            await c.send(m.disconnect(0))
        finally:
            c.close()

    await gather_limited(len(client_ids), 100, end)


async def phase_partial(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """Connections announce a 16,000,000-byte PUBLISH, send 1 kB of it and stall."""
    n = int(200 * scale)
    conns: list[Conn] = []

    async def one(i):
        c = await Conn.open(port)
        conns.append(c)
        ack = await c.connect(f"abuse-partial-{i}", keep_alive=0)
        assert ack.reason == 0, ack
        header = bytes([0x30]) + m.varint(16_000_000)
        await c.send(header + m.string("abuse/partial") + b"\x00" + KB)

    results = await gather_limited(n, 200, one)
    timeout = settings["packet_timeout_secs"]
    outcome = {"connections": n, "errors": count_errors(results)}
    await asyncio.sleep(5)
    outcome["held_rss"] = settings["sampler"].now()
    closed = await asyncio.gather(*(c.closed_by_server(timeout + 15) for c in conns))
    outcome["closed_by_server_within_timeout_plus_15s"] = sum(closed)

    async def release():
        for c in conns:
            c.close()

    return outcome, release()


async def phase_slowloris(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """Half the connections send a CONNECT one byte every 2 s; the other half connect and then
    send a PUBLISH one byte every 2 s."""
    n = int(3000 * scale)
    conns: list[tuple[Conn, bytes]] = []
    connect = m.connect("abuse-slow", keep_alive=0)
    publish = m.publish("abuse/slow", KB)

    async def one(i):
        c = await Conn.open(port)
        if i % 2:
            ack = await c.connect(f"abuse-slow-{i}", keep_alive=0)
            assert ack.reason == 0, ack
            conns.append((c, publish))
        else:
            conns.append((c, connect))

    results = await gather_limited(n, 200, one)
    stop = asyncio.Event()

    async def drip(c: Conn, data: bytes):
        for b in data:
            if stop.is_set():
                return
            try:
                await c.send(bytes([b]))
            except OSError:
                return
            await asyncio.sleep(2)

    drips = [asyncio.create_task(drip(c, d)) for c, d in conns]
    timeout = settings["packet_timeout_secs"]
    await asyncio.sleep(5)
    outcome = {"connections": n, "opened": len(conns), "errors": count_errors(results),
               "held_rss": settings["sampler"].now()}
    closed = await asyncio.gather(*(c.closed_by_server(timeout + 15) for c, _ in conns))
    outcome["closed_by_server"] = sum(closed)
    stop.set()
    await asyncio.gather(*drips, return_exceptions=True)

    async def release():
        for c, _ in conns:
            c.close()

    return outcome, release()


def store_request(args: tuple, response_topic: str, corr: bytes) -> bytes:
    props = [(m.RESPONSE_TOPIC, response_topic), (m.CORRELATION_DATA, corr),
             (m.USER_PROPERTY, ("__ts", f"{int(time.time() * 1000):015d}:00000:abuse"))]
    return m.publish(REQUEST_TOPIC, resp3(*args), props=props)


async def store_flood(c: Conn, client_id: str, requests: list[tuple], window: int) -> dict:
    """Sends every request with at most `window` outstanding; counts the answers by kind."""
    response = f"abuse/{client_id}/response"
    await c.subscribe([(response, 0)])
    answers: dict[str, int] = {}
    outstanding = asyncio.Semaphore(window)

    async def reader():
        for _ in range(len(requests)):
            p = await c.packet(60)
            if p.type != m.PUBLISH:
                continue
            kind = p.payload.split(b"\r\n", 1)[0].decode(errors="replace")
            answers[kind] = answers.get(kind, 0) + 1
            outstanding.release()

    task = asyncio.create_task(reader())
    batch = bytearray()
    for i, args in enumerate(requests):
        if outstanding.locked() and batch:
            await c.send(bytes(batch))
            batch.clear()
        await outstanding.acquire()
        batch += store_request(args, response, i.to_bytes(4, "big"))
        if len(batch) > 32768 or i == len(requests) - 1:
            await c.send(bytes(batch))
            batch.clear()
    await task
    return answers


async def phase_watches(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """KEYNOTIFY registrations: each client registers its limit and 100 more."""
    total = int(200_000 * scale)
    per_client = settings["max_observed_keys"] + 100
    clients = max(1, -(-total // per_client))
    conns: list[Conn] = []

    async def one(i):
        c = await Conn.open(port)
        conns.append(c)
        cid = f"abuse-watch-{i}"
        ack = await c.connect(cid)
        assert ack.reason == 0, ack
        reqs = [("KEYNOTIFY", f"abuse/watch/{i}/{k}") for k in range(per_client)]
        return await store_flood(c, cid, reqs, 1000)

    results = await gather_limited(clients, 8, one)
    answers: dict[str, int] = {}
    for r in results:
        if isinstance(r, dict):
            for k, v in r.items():
                answers[k] = answers.get(k, 0) + v
    outcome = {"clients": clients, "requests": clients * per_client, "answers": answers,
               "errors": count_errors(results), "held_rss": settings["sampler"].now()}

    async def release():
        for c in conns:
            c.close()

    return outcome, release()


async def qos1_flood(c: Conn, packets, window: int) -> dict[int, int]:
    """Sends QoS 1 publishes (packet ids 1..window reused) and counts PUBACK reason codes."""
    reasons: dict[int, int] = {}
    free = asyncio.Semaphore(window)
    total = len(packets)

    async def reader():
        for _ in range(total):
            while True:
                p = await c.packet(60)
                if p.type == m.PUBACK:
                    break
            reasons[p.reason] = reasons.get(p.reason, 0) + 1
            free.release()

    task = asyncio.create_task(reader())
    batch = bytearray()
    for i, make in enumerate(packets):
        if free.locked() and batch:
            await c.send(bytes(batch))
            batch.clear()
        await free.acquire()
        batch += make(1 + i % 65000)
        if len(batch) > 65536 or i == total - 1:
            await c.send(bytes(batch))
            batch.clear()
    await task
    return reasons


async def phase_retained(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """Retained messages of 1 kB on distinct topics, beyond the retained limits."""
    n = int(200_000 * scale)
    c = await Conn.open(port)
    ack = await c.connect("abuse-retained")
    window = ack.prop(m.RECEIVE_MAXIMUM, 65535) or 65535
    window = min(window, 1000)

    def make(i):
        return lambda pid: m.publish(f"abuse/retained/{i}", KB, qos=1, retain=True,
                                     packet_id=pid)

    reasons = await qos1_flood(c, [make(i) for i in range(n)], window)
    outcome = {"publishes": n, "puback_reasons": {hex(k): v for k, v in reasons.items()},
               "held_rss": settings["sampler"].now()}

    # 0x00 and 0x10 (no matching subscribers) are both success.
    kept = reasons.get(0x00, 0) + reasons.get(0x10, 0)

    async def release():
        # Clear what was kept (the first ones, in order): an empty retained publish removes a
        # topic's message.
        await qos1_flood(c, [lambda pid, i=i: m.publish(f"abuse/retained/{i}", b"", qos=1,
                                                         retain=True, packet_id=pid)
                             for i in range(kept)], window)
        c.close()

    return outcome, release()


async def phase_sessions(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """Persistent sessions subscribe and go away; messages are then published to all."""
    n = int(5_000 * scale)
    messages = 100
    props = [(m.SESSION_EXPIRY_INTERVAL, 3600)]

    async def create(i):
        c = await Conn.open(port)
        try:
            ack = await c.connect(f"abuse-session-{i}", clean_start=True, props=props)
            if ack.reason != 0:
                return ack.reason
            await c.subscribe([("abuse/fan/#", 1)])
            await c.send(m.disconnect(0))
            return 0
        finally:
            c.close()

    created = await gather_limited(n, 100, create)
    connack: dict[str, int] = {}
    for r in created:
        key = hex(r) if isinstance(r, int) else type(r).__name__
        connack[key] = connack.get(key, 0) + 1
    pub = await Conn.open(port)
    await pub.connect("abuse-session-publisher")
    reasons = await qos1_flood(
        pub, [lambda pid, i=i: m.publish(f"abuse/fan/{i}", KB, qos=1, packet_id=pid)
              for i in range(messages)], 10)
    await asyncio.sleep(5)
    outcome = {"sessions": n, "connack": connack, "messages_to_all": messages,
               "puback_reasons": {hex(k): v for k, v in reasons.items()},
               "held_rss": settings["sampler"].now()}

    async def release():
        pub.close()
        await end_sessions(port, [f"abuse-session-{i}" for i in range(n)])

    return outcome, release()


async def phase_nonreading(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """Subscribers with tiny receive buffers that never read, while messages flow."""
    subs = 10
    messages = int(20_000 * scale)
    readers: list[Conn] = []
    for i in range(subs):
        c = await Conn.open(port)
        await c.connect(f"abuse-nonreading-{i}", props=[(m.RECEIVE_MAXIMUM, 65535)])
        await c.subscribe([("abuse/nr/#", 1)])
        c.writer.transport.pause_reading()
        readers.append(c)
    pub = await Conn.open(port)
    await pub.connect("abuse-nonreading-publisher")
    reasons = await qos1_flood(
        pub, [lambda pid, i=i: m.publish(f"abuse/nr/{i % 100}", KB, qos=1, packet_id=pid)
              for i in range(messages)], 100)
    await asyncio.sleep(5)
    outcome = {"subscribers": subs, "messages": messages,
               "puback_reasons": {hex(k): v for k, v in reasons.items()},
               "held_rss": settings["sampler"].now()}

    async def release():
        pub.close()
        for c in readers:
            c.close()

    return outcome, release()


async def phase_storm(port: int, scale: float, settings: dict) -> tuple[dict, object]:
    """Garbage connections for --storm-secs: random bytes, mutated CONNECTs, and persistent
    sessions with wills that then send garbage or vanish."""
    rng = random.Random(56)
    deadline = time.monotonic() + settings["storm_secs"]
    kinds = {"random": 0, "mutated": 0, "session-then-garbage": 0, "session-then-vanish": 0}
    failed = {"connect": 0}

    kept: list[int] = []

    def valid_connect(i: int, expiry: int) -> bytes:
        will = m.Will(topic=f"abuse/will/{i}", payload=KB[:100], qos=1,
                      props=[(m.WILL_DELAY_INTERVAL, rng.choice([0, 5, 30]))])
        return m.connect(f"abuse-storm-{i}", clean_start=False, keep_alive=rng.choice([0, 5, 60]),
                         props=[(m.SESSION_EXPIRY_INTERVAL, expiry)], will=will)

    async def worker(w: int):
        i = w
        while time.monotonic() < deadline:
            i += 64
            kind = rng.choice(list(kinds))
            kinds[kind] += 1
            try:
                c = await asyncio.wait_for(Conn.open(port), 5)
            except Exception:  # noqa: BLE001
                failed["connect"] += 1
                continue
            try:
                if kind == "random":
                    await c.send(rng.randbytes(rng.randint(1, 512)))
                elif kind == "mutated":
                    data = bytearray(valid_connect(i, 30))
                    for _ in range(rng.randint(1, 4)):
                        data[rng.randrange(len(data))] = rng.randrange(256)
                    await c.send(bytes(data))
                else:
                    expiry = rng.choice([0, 30, 3600])
                    await c.send(valid_connect(i, expiry))
                    if (await c.packet(5)).reason == 0 and expiry == 3600:
                        kept.append(i)
                    if kind == "session-then-garbage":
                        await c.send(rng.randbytes(rng.randint(1, 256)))
                await asyncio.sleep(rng.random() * 0.05)
            except Exception:  # noqa: BLE001 - the server may close first; that is expected
                pass
            finally:
                c.close()

    await asyncio.gather(*(worker(w) for w in range(64)))
    outcome = {"seconds": settings["storm_secs"], "connections": dict(kinds),
               "total": sum(kinds.values()), "failed": failed, "kept_sessions": len(kept),
               "held_rss": settings["sampler"].now()}

    async def release():
        # Sessions with an expiry of 30 s are gone by themselves; the hour-long ones are ended.
        await asyncio.sleep(35)
        outcome["rss_with_kept_sessions_only"] = settings["sampler"].now()
        await end_sessions(port, [f"abuse-storm-{i}" for i in kept])

    return outcome, release()


PHASES = {
    "partial": phase_partial,
    "slowloris": phase_slowloris,
    "watches": phase_watches,
    "retained": phase_retained,
    "sessions": phase_sessions,
    "nonreading": phase_nonreading,
    "storm": phase_storm,
}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (200_000, hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
            return want
        except (ValueError, OSError):
            continue
    return soft


def mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="mqkv-abuse-"))
    if args.attach:
        port, pid = args.attach.split(":")
        server = Attached(int(port), int(pid))
        (workdir / "server.log").write_text("")
    else:
        server = Server(args.bin, workdir, args.server_args)
    print(f"server pid {server.proc.pid}, port {server.port}, log {workdir / 'server.log'}",
          flush=True)
    sampler = Sampler(server)
    sampler.start()
    good = GoodClient(server.port, sampler)
    good.start()
    settings = {"sampler": sampler, "packet_timeout_secs": 60, "max_observed_keys": 10_000,
                "storm_secs": args.storm_secs}
    sampler.phase = "baseline"
    await asyncio.sleep(5)
    baseline = sampler.now()
    report = {"scale": args.scale, "baseline_rss": baseline, "phases": [],
              "budgets": {"max_queued_bytes": 256 * MIB, "max_retained_bytes": 256 * MIB,
                          "max_retained_messages": 100_000, "max_sessions": 100_000,
                          "max_observed_keys_per_client": 10_000}}
    for name in args.phases:
        print(f"-- {name}", flush=True)
        sampler.phase = name
        started = time.monotonic()
        outcome, release = await PHASES[name](server.port, args.scale, settings)
        await release
        outcome["seconds"] = round(time.monotonic() - started, 1)
        sampler.phase = f"{name} (settling)"
        await asyncio.sleep(args.settle_secs)
        outcome.update(peak_rss=max(sampler.peak(name), outcome.get("held_rss", 0)),
                       settled_rss=sampler.now(),
                       alive=server.alive())
        report["phases"].append({"phase": name, **outcome})
        print(json.dumps(outcome), flush=True)
        if not server.alive():
            break
    sampler.phase = "end"
    good.done.set()
    good.join(15)
    sampler.done.set()
    report["final_rss"] = sampler.now()
    report["good_client"] = {
        phase: {"round_trips": len(r), "p50_ms": round(percentile(r, 0.5) * 1000, 1),
                "p99_ms": round(percentile(r, 0.99) * 1000, 1),
                "max_ms": round(max(r) * 1000, 1), "failures": good.failures.get(phase, 0)}
        for phase, r in good.rtts.items()
    }
    for phase, n in good.failures.items():
        report["good_client"].setdefault(phase, {"round_trips": 0, "failures": n})
    report["samples"] = sampler.samples
    report["server_exit"] = server.stop()
    report["server_panicked"] = b"panicked" in (workdir / "server.log").read_bytes()
    return report


def print_table(report: dict) -> None:
    print(f"\nbaseline {mib(report['baseline_rss'])}; budgets: queued messages "
          f"{mib(report['budgets']['max_queued_bytes'])}, retained "
          f"{mib(report['budgets']['max_retained_bytes'])}")
    print(f"{'phase':<12} {'held':>9} {'peak':>9} {'settled':>9}  {'good client p50/p99/max ms':<28}"
          f" failures")
    good = report["good_client"]
    for p in report["phases"]:
        g = good.get(p["phase"], {})
        rtt = f"{g.get('p50_ms', '-')}/{g.get('p99_ms', '-')}/{g.get('max_ms', '-')}"
        print(f"{p['phase']:<12} {mib(p['held_rss']):>9} {mib(p['peak_rss']):>9} "
              f"{mib(p['settled_rss']):>9}  {rtt:<28} {g.get('failures', 0)}")
    print(f"final {mib(report['final_rss'])}; server exit {report['server_exit']}, "
          f"panicked: {report['server_panicked']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "mqkv"))
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--storm-secs", type=float, default=60.0)
    ap.add_argument("--settle-secs", type=float, default=30.0)
    ap.add_argument("--attach", metavar="PORT:PID",
                    help="flood a server that is already running instead of starting one")
    ap.add_argument("--out", default=str(ROOT / "target" / "abuse"))
    ap.add_argument("server_args", nargs="*", help="extra flags for mqkv serve (after --)")
    args = ap.parse_args()
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in args.phases if p not in PHASES]
    if unknown:
        ap.error(f"unknown phases {unknown}; choose from {list(PHASES)}")
    files = raise_open_files()
    print(f"open-file limit {files}", flush=True)
    report = asyncio.run(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "abuse.json").write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"\nreport: {out / 'abuse.json'}")


if __name__ == "__main__":
    main()
