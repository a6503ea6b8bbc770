"""Stopping the processes tests start (API servers, engines, cluster components)."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(process: subprocess.Popen[Any], timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after `timeout` seconds; the exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
