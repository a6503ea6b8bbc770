"""Free TCP ports for test servers, never handed to two pytest-xdist workers of one run.

Binding port 0 asks the kernel for a free port, but the port is free again as soon as the probe
socket closes, so two workers starting servers at once could be given the same one. Every port
handed out in a run is recorded in one file under a file lock, and a recorded port is not given again.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from pathlib import Path

_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"pid{os.getpid()}")
RESERVED = Path(tempfile.gettempdir()) / f"foxhunt-test-ports-{_RUN}"
"""The ports handed out in this run, one a line (xdist gives all workers of a run the same id)."""


def _probe() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port(reserved: Path = RESERVED) -> int:
    """A port nothing listens on now and that no other caller in this run has been given."""
    with reserved.open("a+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)  # released when the file closes
        ledger.seek(0)
        taken = {int(line) for line in ledger.read().split()}
        for _ in range(100):
            port = _probe()
            if port not in taken:
                ledger.write(f"{port}\n")
                return port
    raise RuntimeError(f"the kernel kept offering ports already handed out (see {reserved})")
