"""`python -m service.backends.local_supervisor JOB_DIR ATTEMPT -- TRAINER...`: runs one local job attempt.

Runs the job's pipeline (local_pipeline.py) with TRAINER as the trainer program, then records how it
ended in `JOB_DIR/exit-<ATTEMPT>.json` (exit code; the failed step and its last line); that file is
how a restarted controller learns how a job ended. The SIGTERM handler is installed before anything
else is imported: a SIGTERM to the process group (a cancel) reaches the running step directly, and
this process outlives it to run the exit handler and write the code down.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from contracts.jsonfile import write_json_atomic


def supervise(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m service.backends.local_supervisor JOB_DIR ATTEMPT -- TRAINER...", file=sys.stderr)
        return 2
    job_dir, attempt, _, *trainer = argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    record: dict[str, object]
    try:
        from service.backends.local_pipeline import run_job

        outcome = run_job(Path(job_dir), int(attempt), trainer, stop)
        record = {"code": outcome.code, "step": outcome.step, "last_line": outcome.last_line}
    except Exception as error:  # the executor itself broke (unreadable job.json, …): recorded, not lost
        traceback.print_exc()
        sys.stdout.flush()
        record = {"code": 1, "step": None, "last_line": f"the local pipeline executor failed: {error!r}"}
    write_json_atomic(Path(job_dir) / f"exit-{attempt}.json", {**record, "finished_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1:]))
