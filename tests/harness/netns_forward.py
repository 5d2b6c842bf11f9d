"""Forward loopback ports between the root namespace and one network namespace.

    python netns_forward.py [--outward] /run/netns/NAME LISTEN_PORT=ADDRESS:PORT ...

Inward (the default) it binds every ``127.0.0.1:LISTEN_PORT`` first, then moves itself into the
namespace (``setns`` through libc; no thread exists yet, so the whole process moves), then forwards
each accepted connection to its ``ADDRESS:PORT`` from inside that namespace. So a test process in the
root namespace reaches the nodes with plain loopback addresses, and its packets leave from the
namespace's own links.

``--outward`` is the other way round: it binds ``127.0.0.1:LISTEN_PORT`` inside the namespace, moves
back to the namespace it started in, and connects to ``ADDRESS:PORT`` from there. So processes in the
namespace reach exactly the listed services of the root namespace and nothing else (a Spark
executor reaches its driver and S3, not the coordinator).

A listening socket stays in the namespace it was made in, whatever the process does afterwards. It
prints ``ready`` once it forwards. Standard library only.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys
from collections.abc import Awaitable, Callable

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT_S = 30.0


def enter_namespace(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns(fd, path)
    finally:
        os.close(fd)


def _setns(fd: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({what}): {os.strerror(err)}")


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def handler(address: str, port: int) -> Handler:
    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(address, port), CONNECT_TIMEOUT_S
            )
        except (TimeoutError, OSError):
            writer.close()
            return
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    return forward


async def main(path: str, specs: list[str], *, outward: bool = False) -> None:
    home = os.open("/proc/self/ns/net", os.O_RDONLY)  # the namespace this process started in
    if outward:
        enter_namespace(path)
    listeners = []
    for spec in specs:
        listen, _, target = spec.partition("=")
        address, _, port = target.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(listen)))
        sock.listen(128)
        listeners.append((sock, address, int(port)))
    if outward:
        _setns(home, "the starting namespace")
    else:
        enter_namespace(path)
    os.close(home)
    servers = [await asyncio.start_server(handler(a, p), sock=s) for s, a, p in listeners]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    out = sys.argv[1:2] == ["--outward"]
    args = sys.argv[2:] if out else sys.argv[1:]
    asyncio.run(main(args[0], args[1:], outward=out))
