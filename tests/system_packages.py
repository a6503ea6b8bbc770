"""Install the Debian packages a test needs (tests run as root in CI, on a clean machine)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

_lock = threading.Lock()
_updated = False


def ensure_debian_packages(binary: str, *packages: str) -> str:
    """Return the path of `binary`, installing `packages` with apt-get first if it is missing."""
    global _updated
    found = shutil.which(binary)
    if found:
        return found
    with _lock:
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
