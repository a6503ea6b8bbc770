"""`python -m service.backends.local_supervisor JOB_DIR ATTEMPT -- COMMAND...`: runs one local job.

Runs COMMAND, then records its exit code in `JOB_DIR/exit-<ATTEMPT>.json`; that file is how a
restarted controller learns how a job ended. Standard library only, so it starts (and installs its
SIGTERM handler) fast: a SIGTERM to the process group reaches the trainer directly, and this process
outlives it to write the code down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def supervise(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m service.backends.local_supervisor JOB_DIR ATTEMPT -- COMMAND...", file=sys.stderr)
        return 2
    job_dir, attempt, _, *command = argv
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        code = subprocess.call(command)
    except OSError as error:
        print(f"error: cannot start {command[0]}: {error}", flush=True)
        code = 127
    target = Path(job_dir) / f"exit-{attempt}.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"code": code, "finished_at": time.time()}))
    os.replace(tmp, target)
    return 0


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
