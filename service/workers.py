"""Several API processes on one host (`foxhunt serve --workers N`), the reconciler running in exactly one.

One interpreter lock made one process the ceiling of the API's throughput. With N worker processes every
one serves the API, and the reconciler (and, with leader election, its Lease loop) runs only in the one
that holds an exclusive `flock` on `FOXHUNT_RECONCILER_LOCK_FILE`: the others try again every half second,
so when the holder exits (or is killed: the kernel drops its lock) another takes over. The holder listens
on a Unix datagram socket beside the lock file; every worker sends it one byte for a new job (`q`: a
submit pass) or a cancel or retry (`w`: a full pass), so a job queued in any worker reaches the backend as
promptly as in one process. The quota needs nothing of this: it holds across processes on both databases
(docs/controller.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.5
"""How often a worker without the lock tries to take it, and how often the holder checks for a stop."""
QUEUED, WAKE = b"q", b"w"


@dataclass(eq=False)
class ReconcilerSeat:
    """The reconciler's place among the worker processes sharing `lock_file`: `start` runs while this process
    holds the lock, `stop` when it gives it up (at `close`); `queued` and `wake` are what the holder calls
    when any worker notifies it."""

    lock_file: Path
    start: Callable[[], None]
    stop: Callable[[], None]
    queued: Callable[[], None]
    wake: Callable[[], None]
    holding: threading.Event = field(default_factory=threading.Event, init=False)
    _closing: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _sender: socket.socket | None = field(default=None, init=False)

    @property
    def socket_path(self) -> Path:
        return self.lock_file.with_name(self.lock_file.name + ".wake")

    def open(self) -> None:
        self._closing.clear()
        self._thread = threading.Thread(target=self._run, name="reconciler-seat", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=RETRY_SECONDS * 4 + 30)
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def notify(self, kind: bytes) -> None:
        """Tell the holder (whichever worker it is, this one too): a new job (`QUEUED`) or a full pass (`WAKE`).
        Never blocks and never fails the request: a lost byte leaves the job to the next full pass."""
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        with contextlib.suppress(OSError):
            self._sender.sendto(kind, str(self.socket_path))

    def _run(self) -> None:
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self._closing.wait(RETRY_SECONDS):
                        return
            self._hold()
        finally:
            os.close(fd)  # drops the lock: another worker takes the seat

    def _hold(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # the previous holder's, gone with it
        listener.bind(str(self.socket_path))
        listener.settimeout(RETRY_SECONDS)
        log.info("this worker (pid %d) runs the reconciler", os.getpid())
        self.holding.set()
        self.start()
        try:
            while not self._closing.is_set():
                try:
                    data = listener.recv(4096)
                except TimeoutError:
                    continue
                if WAKE in data:
                    self.wake()
                elif QUEUED in data:
                    self.queued()
        finally:
            self.stop()
            self.holding.clear()
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
