#!/usr/bin/env python3
"""Plain TCP in, TLS or WebSocket out: lets a test suite that speaks only MQTT over TCP (the
public MQTT conformance suites) run against mqkv's TLS, WebSocket and WebSocket over TLS
listeners. Each client connection gets its own upstream connection; bytes are passed on as they
come (one WebSocket binary frame per chunk read), and either side closing closes the other.

    python3 scripts/transport-proxy.py --listen 127.0.0.1:18830 --to tls://127.0.0.1:8883 --cafile ca.pem
    python3 scripts/transport-proxy.py --listen 127.0.0.1:18830 --to ws://127.0.0.1:8080/mqtt
    python3 scripts/transport-proxy.py --listen 127.0.0.1:18830 --to wss://127.0.0.1:8443/mqtt --cafile ca.pem
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import ssl
import struct
from urllib.parse import urlparse


def frame(payload: bytes, opcode: int = 2) -> bytes:
    """A masked client frame."""
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return header + mask + masked


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    mask = await reader.readexactly(4) if b1 & 0x80 else None
    payload = await reader.readexactly(n)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return b0 & 0x0F, payload


async def open_upstream(url, cafile):
    u = urlparse(url)
    context = None
    if u.scheme in ("tls", "wss"):
        context = ssl.create_default_context(cafile=cafile)
        context.check_hostname = False
    reader, writer = await asyncio.open_connection(u.hostname, u.port, ssl=context)
    if u.scheme in ("ws", "wss"):
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {u.path or '/mqtt'} HTTP/1.1\r\nHost: {u.hostname}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
            ).encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"upgrade refused: {head[:60]!r}")
    return reader, writer, u.scheme in ("ws", "wss")


async def pump_out(src, dst, websocket):
    """Client to server. Once the server's side is closed, what the client still sends is read
    and dropped until it closes, as a server's own socket would (closing with unread input
    would reset the client's connection)."""
    open_ = True
    while chunk := await src.read(65536):
        if not open_:
            continue
        try:
            dst.write(frame(chunk) if websocket else chunk)
            await dst.drain()
        except (ConnectionError, OSError):
            open_ = False
    if open_ and websocket:
        try:
            dst.write(frame(b"", opcode=8))
            await dst.drain()
        except (ConnectionError, OSError):
            pass
    dst.close()


async def pump_in(src, dst, websocket):
    try:
        if websocket:
            while True:
                opcode, payload = await read_frame(src)
                if opcode == 8:
                    break
                if opcode in (0, 2):
                    dst.write(payload)
                    await dst.drain()
        else:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        # Half-close: the client reads the end of the stream and may still send.
        if dst.can_write_eof():
            dst.write_eof()
        else:
            dst.close()


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="ADDR:PORT to accept plain TCP on")
    p.add_argument("--to", required=True, help="tls://, ws:// or wss:// URL of the listener")
    p.add_argument("--cafile", help="CA that signed the server's certificate")
    a = p.parse_args()

    async def serve(client_reader, client_writer):
        try:
            up_reader, up_writer, websocket = await open_upstream(a.to, a.cafile)
        except (ConnectionError, OSError) as e:
            print(f"upstream: {e}", flush=True)
            client_writer.close()
            return
        await asyncio.gather(
            pump_out(client_reader, up_writer, websocket),
            pump_in(up_reader, client_writer, websocket),
        )
        client_writer.close()

    host, port = a.listen.rsplit(":", 1)
    server = await asyncio.start_server(serve, host, int(port))
    print(f"proxying {a.listen} -> {a.to}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
