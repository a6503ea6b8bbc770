"""Install the Debian packages a test needs (tests run as root in CI, on a clean machine)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "foxhunt-apt-get.lock"
"""Held around apt-get: pytest-xdist workers (and threads) installing at once would fight over dpkg's lock."""

_updated = False


def ensure_debian_packages(binary: str, *packages: str) -> str:
    """Return the path of `binary`, installing `packages` with apt-get first if it is missing."""
    global _updated
    found = shutil.which(binary)
    if found:
        return found
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        found = shutil.which(binary)  # another worker may have installed it while this one waited
        if found:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if not _updated:
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
            _updated = True
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
            check=True,
            env=env,
            capture_output=True,
        )
    found = shutil.which(binary)
    if not found:
        raise RuntimeError(f"installed {packages} but {binary} is still not on PATH")
    return found
