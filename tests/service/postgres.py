"""A throwaway PostgreSQL server for the store tests: initdb + pg_ctl in a temp dir, on a free port.

Under pytest-xdist each worker starts its own (session fixture `postgres_admin_url`): its own data
directory (mkdtemp) and socket directory, and a port no other worker of the run is given
(tests/ports.py). A start that still loses its port to some other program is retried on a new one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import free_port
from tests.system_packages import ensure_debian_packages

START_ATTEMPTS = 3
"""Ports tried before giving up (another program may take a port between the probe and the start)."""
PG_BIN_DIRS = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")


def _find_pg_bin() -> Path | None:
    for candidate in PG_BIN_DIRS:
        if (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    found = shutil.which("pg_ctl")
    return Path(os.path.realpath(found)).parent if found else None


def _pg_bin() -> Path:
    """The server binaries; Debian's `postgresql` puts them off PATH, under /usr/lib/postgresql/N/bin."""
    found = _find_pg_bin()
    if found is None:
        ensure_debian_packages("pg_ctlcluster", "postgresql")  # postgresql-common's wrapper is on PATH
        found = _find_pg_bin()
    if found is None:
        raise RuntimeError(f"installed postgresql but found no pg_ctl in {', '.join(PG_BIN_DIRS)} or on PATH")
    return found


def _as_postgres(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root; run its tools as the `postgres` user then."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields an admin URL (`postgresql+psycopg://postgres@127.0.0.1:PORT/postgres`); stops and removes it after."""
    pg_bin = _pg_bin()
    root = Path(tempfile.mkdtemp(prefix="foxhunt-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    initdb = [str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
    subprocess.run(_as_postgres(initdb), check=True, capture_output=True, text=True)
    for attempt in range(START_ATTEMPTS):
        port = free_port()
        options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        start = [str(pg_bin / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]
        started = subprocess.run(_as_postgres(start), capture_output=True, text=True, check=False)
        if started.returncode == 0:
            break
        if attempt == START_ATTEMPTS - 1:
            log = (root / "log").read_text() if (root / "log").exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"pg_ctl start failed {START_ATTEMPTS} times: {started.stderr}\n{log[-2000:]}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def create_database(admin_url: str, name: str) -> str:
    """A new, empty database `name` on the server of `admin_url`; its URL (same server and user)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{name}"
