"""The server's keepalive policy never cuts off a client with the project's keepalive settings.

gRPC's server default accepts a ping on a connection sending no data only every 5 minutes, and
none without calls; a client past 2 "strikes" gets GOAWAY too_many_pings. The snapcoord client
pings every 60 s (``KEEPALIVE_OPTIONS``); the server accepts one every 30 s
(``--keepalive-min-ping-interval``) with or without calls. The tests keep that ratio at a scale
where a run takes seconds: the client pings every second, the server accepts every half second.
The client also pings without limit through a quiet call (``max_pings_without_data`` 0, as
grpc-java and grpc-go clients do; the Python default stops after two), so a strike would show.

What is asserted is the connection itself, read from channelz: the client's socket sent many
keepalive pings, and it is still the one socket of the channel, which never left READY; the quiet
call is still open. The control (the server at gRPC's default policy) proves that this setup sees
a GOAWAY when the policy is wrong.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_channelz.v1 import channelz, channelz_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from snapcoord.client._channel import KEEPALIVE_OPTIONS
from snapcoord.coordinator.config import options, settings

CLIENT_KEEPALIVE_MS = 1_000
#: The server's interval at the ratio of the defaults (30 s to the client's 60 s).
SERVER_MIN_PING_INTERVAL_MS = (
    CLIENT_KEEPALIVE_MS
    * options.parse_duration_ms(
        next(o.default for o in options.OPTIONS if o.name == "keepalive_min_ping_interval") or ""
    )
    // KEEPALIVE_OPTIONS["grpc.keepalive_time_ms"]
)
#: Several times the strikes a server tolerates: a wrong policy would have sent GOAWAY by then.
PINGS = 8


def test_the_default_policy_accepts_the_clients_keepalive() -> None:
    defaults = settings.load({}, {}).grpc
    assert defaults.keepalive_min_ping_interval_ms <= KEEPALIVE_OPTIONS["grpc.keepalive_time_ms"]
    assert SERVER_MIN_PING_INTERVAL_MS < CLIENT_KEEPALIVE_MS


def client_options(*, without_calls: bool) -> list[tuple[str, Any]]:
    """The project's keepalive settings, scaled; each channel with its own connection."""
    options: dict[str, Any] = {**KEEPALIVE_OPTIONS, "grpc.keepalive_time_ms": CLIENT_KEEPALIVE_MS}
    options["grpc.http2.max_pings_without_data"] = 0
    options["grpc.keepalive_permit_without_calls"] = int(without_calls)
    options["grpc.use_local_subchannel_pool"] = 1
    return list(options.items())


def sockets(target: str) -> list[channelz_pb2.Socket]:
    """The client sockets (connections) of the channel whose target ends with ``target``."""
    found = []
    start = 0
    while True:
        page = channelz.ChannelzServicer.GetTopChannels(
            channelz_pb2.GetTopChannelsRequest(start_channel_id=start), None
        )
        for channel in page.channel:
            start = max(start, channel.ref.channel_id + 1)
            if not channel.data.target.endswith(target):
                continue
            for ref in channel.subchannel_ref:
                sub = channelz.ChannelzServicer.GetSubchannel(
                    channelz_pb2.GetSubchannelRequest(subchannel_id=ref.subchannel_id), None
                )
                for socket_ref in sub.subchannel.socket_ref:
                    reply = channelz.ChannelzServicer.GetSocket(
                        channelz_pb2.GetSocketRequest(socket_id=socket_ref.socket_id), None
                    )
                    found.append(reply.socket)
        if page.end or not page.channel:
            return found


class QuietCall:
    """A health Watch: one reply, then nothing on the stream (a call in flight, no data)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._replies = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first = next(self._replies)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            for _ in self._replies:
                pass
        except grpc.RpcError as e:
            self.error = e

    @property
    def open(self) -> bool:
        return self._thread.is_alive()

    def cancel(self) -> None:
        self._replies.cancel()
        self._thread.join(30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[CoordinatorProcess]:
    args = ["--keepalive-min-ping-interval", f"{SERVER_MIN_PING_INTERVAL_MS}ms"]
    with CoordinatorProcess(tmp_path / "coordinator", args=args) as process:
        yield process


def _connected(target: str, channel: grpc.Channel, states: list[grpc.ChannelConnectivity]) -> int:
    """Connect ``channel`` with one call; returns the id of its one socket."""
    channel.subscribe(states.append, try_to_connect=True)
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    (sock,) = sockets(target)
    return int(sock.ref.socket_id)


def _still_connected(target: str, channel: grpc.Channel, socket_id: int, states: list[Any]) -> None:
    # A call still goes through, on the same connection, and the channel never left READY.
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    (sock,) = sockets(target)
    assert sock.ref.socket_id == socket_id, "the connection was replaced"
    assert sock.data.keep_alives_sent >= PINGS
    ready = states.index(grpc.ChannelConnectivity.READY)
    assert states[ready:] == [grpc.ChannelConnectivity.READY], states


@pytest.mark.timeout(300)
@pytest.mark.process
def test_a_quiet_call_outlives_many_keepalive_pings(server: CoordinatorProcess) -> None:
    states: list[grpc.ChannelConnectivity] = []
    with grpc.insecure_channel(server.target, options=client_options(without_calls=False)) as channel:
        socket_id = _connected(server.target, channel, states)
        call = QuietCall(channel)

        def pinged() -> bool:
            assert call.open, f"the quiet call ended: {call.error}"
            (sock,) = sockets(server.target)
            return bool(sock.data.keep_alives_sent >= PINGS)

        wait_until(pinged, timeout=240, interval=0.2, what=f"{PINGS} keepalive pings")
        assert call.open and call.error is None
        _still_connected(server.target, channel, socket_id, states)
        call.cancel()


@pytest.mark.timeout(300)
@pytest.mark.process
def test_an_idle_connection_pinging_without_calls_is_kept(server: CoordinatorProcess) -> None:
    states: list[grpc.ChannelConnectivity] = []
    with grpc.insecure_channel(server.target, options=client_options(without_calls=True)) as channel:
        socket_id = _connected(server.target, channel, states)

        def pinged() -> bool:
            (sock,) = sockets(server.target)
            assert sock.ref.socket_id == socket_id, "the connection was replaced"
            return bool(sock.data.keep_alives_sent >= PINGS)

        wait_until(pinged, timeout=240, interval=0.2, what=f"{PINGS} keepalive pings without calls")
        _still_connected(server.target, channel, socket_id, states)


@pytest.mark.timeout(300)
@pytest.mark.process
def test_control_grpcs_default_policy_sends_goaway_to_the_same_client(tmp_path: Path) -> None:
    """Without the policy (gRPC's default: 5 minutes), the same client is cut off: the test above
    would see it."""
    args = ["--keepalive-min-ping-interval", "5m"]
    with (
        CoordinatorProcess(tmp_path / "coordinator", args=args) as process,
        grpc.insecure_channel(process.target, options=client_options(without_calls=False)) as channel,
    ):
        _connected(process.target, channel, [])
        call = QuietCall(channel)
        wait_until(lambda: not call.open, timeout=240, interval=0.2, what="the GOAWAY")
        assert isinstance(call.error, grpc.Call)
        assert call.error.code() == grpc.StatusCode.UNAVAILABLE
        assert "too many pings" in (call.error.details() or "").lower()
