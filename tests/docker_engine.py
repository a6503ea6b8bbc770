"""A Docker engine of the tests' own (Debian's docker.io): no bridge, no iptables, its data in a cache
of its own. The images tests build and run both images on it; the cluster tests build the trainer
image on it and copy it into the real node's containerd."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_until
from tests.processes import stop_process
from tests.system_packages import ensure_debian_packages

# Debian docker.io's own client: it builds with the engine's BuildKit. A newer client elsewhere on PATH
# needs the buildx plugin for that, which Debian bookworm does not package.
DOCKER = "/usr/bin/docker"
# The engine's data, kept between runs: the images tests and the cluster tests build on the same layers,
# and a second run rebuilds only what changed (the stand-in bases are built only when missing).
CACHE = Path(os.environ.get("FOXHUNT_DOCKER_CACHE", "/var/cache/foxhunt-docker"))


@dataclass(frozen=True)
class Engine:
    """A docker client bound to our own engine."""

    host: str

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [DOCKER, *args], env={**os.environ, "DOCKER_HOST": self.host}, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if check:
            assert result.returncode == 0, f"docker {' '.join(args)}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
        return result


@contextmanager
def docker_engine(root: Path = CACHE) -> Iterator[Engine]:
    """dockerd with its data under `root`; stopped at the end, its tagged images and build cache kept."""
    dockerd = ensure_debian_packages("dockerd", "docker.io")
    ensure_debian_packages("debootstrap", "debootstrap")
    root.mkdir(parents=True, exist_ok=True)
    socket = f"unix://{root}/engine.sock"
    log = (root / "dockerd.log").open("w")
    process = subprocess.Popen(
        [
            dockerd, "--iptables=false", "--ip6tables=false", "--bridge=none", "--storage-driver=overlay2",
            f"--data-root={root}/data", f"--exec-root={root}/exec", f"--pidfile={root}/dockerd.pid", f"--host={socket}",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    client = Engine(socket)
    try:

        def up() -> bool:
            if process.poll() is not None:
                log_tail = (root / "dockerd.log").read_text()[-3000:]
                raise AssertionError(f"dockerd exited {process.returncode}: {log_tail}")
            return client("version", timeout=30, check=False).returncode == 0

        wait_until(up, timeout=120, interval=0.5, what="dockerd to answer")
        yield client
    finally:
        for container in client("ps", "-aq", check=False).stdout.split():
            client("rm", "-f", container, check=False)
        # Every rebuild leaves the image its tag moved away from (5 GB for a trainer) and more build cache:
        # the cache keeps tagged images and the newest 4 GB of build cache, or it fills the disk in a few runs.
        client("image", "prune", "--force", check=False)
        client("builder", "prune", "--force", "--keep-storage", "4GB", check=False)
        stop_process(process, timeout=60)
        log.close()
        # The engine leaves its netns mounted under the exec root; unmount what is ours, deepest first.
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
            subprocess.run(["umount", mount], capture_output=True, timeout=60)
