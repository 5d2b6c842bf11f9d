"""read_ahead: pieces arrive in order and whole, at most ``depth`` are read beyond what the
caller took, an error surfaces at its own piece, and however the caller stops the source is
closed, only after the read in progress finished."""

from __future__ import annotations

import threading
from collections.abc import Generator

import pytest

from snapcoord.coordinator.snapshots.read_ahead import read_ahead


class Source:
    """A generator of ``count`` pieces that records what was read, by which thread, and its end."""

    def __init__(self, count: int, fail_at: int | None = None) -> None:
        self.count = count
        self.fail_at = fail_at
        self.produced = 0
        self.closed = threading.Event()
        self.threads: set[str] = set()

    def pieces(self) -> Generator[bytes, None, None]:
        try:
            for n in range(self.count):
                self.threads.add(threading.current_thread().name)
                if n == self.fail_at:
                    raise OSError(f"read {n} failed")
                self.produced += 1
                yield bytes([n]) * (n + 1)
        finally:
            self.closed.set()


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_every_piece_arrives_in_order_with_at_most_depth_read_ahead(depth: int, count: int) -> None:
    source = Source(count)
    got = []
    for piece in read_ahead(source.pieces(), depth, "test-read-ahead"):
        got.append(piece)
        # The pieces read so far: those taken plus at most `depth` in reserve.
        assert source.produced <= len(got) + depth
    assert got == [bytes([n]) * (n + 1) for n in range(count)]
    assert source.closed.is_set()
    assert all(name.startswith("test-read-ahead") for name in source.threads)  # not the caller's


def test_an_error_is_raised_at_its_piece_after_the_pieces_before_it() -> None:
    source = Source(5, fail_at=2)
    got = []
    with pytest.raises(OSError, match="read 2 failed"):
        for piece in read_ahead(source.pieces(), 2, "test-read-ahead"):
            got.append(piece)
    assert got == [b"\x00", b"\x01\x01"]
    assert source.closed.is_set()


@pytest.mark.parametrize("depth", [1, 3])
def test_a_caller_that_stops_early_closes_the_source_after_the_reads_in_flight(depth: int) -> None:
    source = Source(100)
    stream = read_ahead(source.pieces(), depth, "test-read-ahead")
    assert next(stream) == b"\x00"
    # Closing a generator while another thread runs it raises ValueError ("generator already
    # executing"): this close returning means the source was closed between reads.
    stream.close()
    assert source.closed.is_set()
    assert source.produced <= 1 + depth  # reads not started were dropped


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth must be at least 1"):
        next(read_ahead(Source(1).pieces(), 0, "test-read-ahead"))
