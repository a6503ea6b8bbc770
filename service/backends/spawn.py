"""Starting a child process, tried again when the machine rather than the command failed.

Under load a fork or exec can fail for reasons that pass: EAGAIN at a process limit, ENOMEM, and EFAULT, which
one `make test` run saw from the local backend's `Popen` in a sandbox. Failing the job (SubmitRejected) for that
loses a user's work to a moment's pressure; a missing or unrunnable program (ENOENT, EACCES) fails at once."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Sequence
from typing import Any

PASSING_ERRNOS = frozenset({errno.EAGAIN, errno.ENOMEM, errno.EFAULT, errno.EINTR})
TRIES = 3
BACKOFF_S = 0.05
"""Seconds before the second try; doubled before each later one."""


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **popen)`, tried up to `TRIES` times while it fails with a passing errno."""
    for attempt in range(TRIES - 1):
        try:
            return subprocess.Popen(argv, **popen)
        except OSError as error:
            if error.errno not in PASSING_ERRNOS:
                raise
            time.sleep(BACKOFF_S * 2**attempt)
    return subprocess.Popen(argv, **popen)  # the last try: whatever it raises is the caller's
