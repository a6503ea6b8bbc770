"""A blocking line stream read on a thread of its own, so that its consumer gets control back while
no line comes.

The logs route hands a backend's lines to an HTTP client one `next()` at a time on a worker thread.
When the client goes away, the route stops asking, but a `next()` blocked in a quiet pod's log
stream would hold its thread until that pod's next line. Ticks bound the hold to one period, and
closing the generator interrupts the blocked read.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

_END = object()


def with_idle_ticks(
    lines: Iterator[str], *, every: float, interrupt: Callable[[], None], name: str = "line-reader"
) -> Iterator[str]:
    """Yield `lines`, and "" each `every` seconds that none arrives; an error of the read is raised here.

    `interrupt` must make a read blocked in `lines` return or raise (for a socket: shut it down);
    it is called when the generator is closed before the reader has ended, so it must also accept a
    read that ended a moment before.
    """
    arrived: queue.Queue[object] = queue.Queue()

    def read() -> None:
        try:
            for line in lines:
                arrived.put(line)
        except Exception as error:  # handed to the consumer, which raises it in its own thread
            arrived.put(error)
        arrived.put(_END)

    reader = threading.Thread(target=read, name=name, daemon=True)
    reader.start()
    try:
        while True:
            try:
                item = arrived.get(timeout=every)
            except queue.Empty:
                yield ""
                continue
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            assert isinstance(item, str)
            yield item
    finally:
        if reader.is_alive():
            interrupt()
            reader.join(timeout=max(every, 1.0))
