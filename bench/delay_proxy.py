"""A TCP proxy that delays what clients send: a storage server's network latency on loopback.

    python delay_proxy.py HOST:PORT@DELAY_MS [HOST:PORT@DELAY_MS ...]

For each argument it listens on a free loopback port and forwards every connection to HOST:PORT.
Each chunk a client sends is handed to the server DELAY_MS after it arrived (in order; chunks in
flight overlap, so a burst is delayed once, not once per chunk); replies pass back undelayed. A
request therefore reaches the server DELAY_MS late, and a client that waits for a reply before it
sends more pays DELAY_MS per such exchange: boto3's PUT sends its headers, waits for the server's
``100 Continue``, then sends the body, so a PUT pays it twice (as against a real S3). The delay
is a lower bound: the event loop's timers round up to the next millisecond.

Once every port listens it prints ``ready PORT [PORT ...]`` (in the order of the arguments) and
serves until it is terminated. It runs as its own process, so that forwarding does not compete
with the load generator for its interpreter's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass

CHUNK_BYTES = 256 * 1024


@dataclass(frozen=True)
class Route:
    """Forward to ``host:port``, delaying the client's bytes by ``delay_s``."""

    host: str
    port: int
    delay_s: float

    @classmethod
    def parse(cls, text: str) -> Route:
        target, sep, delay = text.rpartition("@")
        host, colon, port = target.rpartition(":")
        if not sep or not colon or not host or not port.isdigit():
            raise SystemExit(f"delay_proxy: {text!r} is not HOST:PORT@DELAY_MS")
        try:
            delay_ms = float(delay)
        except ValueError:
            raise SystemExit(f"delay_proxy: {text!r}: the delay {delay!r} is not a number of ms") from None
        if delay_ms < 0:
            raise SystemExit(f"delay_proxy: {text!r}: the delay must not be negative")
        return cls(host, int(port), delay_ms / 1000)


async def _delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk written ``delay_s`` after it was read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(forward())
    try:
        while True:
            data = await reader.read(CHUNK_BYTES)
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
        await sender
    finally:
        sender.cancel()


async def _plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(CHUNK_BYTES):
        writer.write(data)
        await writer.drain()


async def _serve(route: Route, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    """One client connection: forward until either side closes, then close both."""
    try:
        server_r, server_w = await asyncio.open_connection(route.host, route.port)
    except OSError:
        client_w.close()
        return
    pumps = [
        asyncio.create_task(_delayed(client_r, server_w, route.delay_s)),
        asyncio.create_task(_plain(server_r, client_w)),
    ]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        for w in (server_w, client_w):
            w.close()
        for pump in pumps:  # a reset connection ends its pump with an error: the connection is over
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await pump


async def main(routes: list[Route]) -> None:
    servers = []
    for route in routes:

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, route: Route = route) -> None:
            await _serve(route, r, w)

        servers.append(await asyncio.start_server(handle, "127.0.0.1", 0))
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print("ready " + " ".join(str(p) for p in ports), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    asyncio.run(main([Route.parse(a) for a in sys.argv[1:]]))
