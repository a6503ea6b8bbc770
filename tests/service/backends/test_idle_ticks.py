import queue
import threading
from collections.abc import Iterator

import pytest

from service.backends.idle_ticks import with_idle_ticks


class BlockingLines:
    """Lines handed over one by one from the test; `interrupt` makes a blocked read fail, as a socket
    shut down does."""

    def __init__(self) -> None:
        self.pending: queue.Queue[str | Exception | None] = queue.Queue()
        self.interrupted = threading.Event()

    def __iter__(self) -> Iterator[str]:
        while (item := self.pending.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    def interrupt(self) -> None:
        self.interrupted.set()
        self.pending.put(OSError("shut down"))


def test_lines_pass_through_with_ticks_while_quiet_and_the_stream_end_ends_them() -> None:
    source = BlockingLines()
    lines = with_idle_ticks(iter(source), every=0.01, interrupt=source.interrupt)
    source.pending.put("one\n")
    assert next(lines) == "one\n"
    assert next(lines) == ""
    source.pending.put("two\n")
    assert [line for line in _until_end(lines, source) if line] == ["two\n"]
    assert not source.interrupted.is_set()  # the stream ended by itself: nothing to interrupt


def test_an_error_of_the_read_is_raised_to_the_consumer() -> None:
    source = BlockingLines()
    source.pending.put("one\n")
    source.pending.put(ConnectionResetError("peer went away"))
    lines = with_idle_ticks(iter(source), every=5, interrupt=source.interrupt)
    assert next(lines) == "one\n"
    with pytest.raises(ConnectionResetError, match="peer went away"):
        next(lines)


def test_closing_early_interrupts_the_blocked_read_and_the_reader_ends() -> None:
    source = BlockingLines()
    lines = with_idle_ticks(iter(source), every=0.01, interrupt=source.interrupt, name="reader-under-test")
    assert next(lines) == ""
    (reader,) = [t for t in threading.enumerate() if t.name == "reader-under-test"]
    lines.close()
    assert source.interrupted.is_set()
    reader.join(timeout=30)
    assert not reader.is_alive()


def _until_end(lines: Iterator[str], source: BlockingLines) -> Iterator[str]:
    for line in lines:
        yield line
        if line == "two\n":
            source.pending.put(None)
