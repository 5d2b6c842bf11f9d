"""What an interceptor serves for a method, built once and reused for every call of it.

gRPC Python runs a server's interceptors for each new call on its one thread that accepts calls,
before a handler thread takes the call over; whatever an interceptor builds there per call (a
wrapped handler, its closures) is paid serially by every call. The handlers it is given are the
registered ones (the same object for every call of a method), so what it builds from them can be
kept: ``HandlerMemo`` keeps it per method, rebuilt only if a method's handler is another object.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc


class HandlerMemo:
    """Per method path: the handler an interceptor was given and the one it serves for it."""

    def __init__(self) -> None:
        self._served: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def served(
        self,
        path: str,
        handler: grpc.RpcMethodHandler,
        build: Callable[[grpc.RpcMethodHandler, str], grpc.RpcMethodHandler],
    ) -> grpc.RpcMethodHandler:
        """``build(handler, path)``, from the memo when ``handler`` is the one it was built from."""
        known = self._served.get(path)
        if known is not None and known[0] is handler:
            return known[1]
        served = build(handler, path)
        self._served[path] = (handler, served)  # a race only builds the same one twice
        return served

    def clear(self) -> None:
        self._served.clear()
