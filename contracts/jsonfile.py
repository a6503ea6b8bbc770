"""JSON files written atomically, read forgivingly. Torch-free: the controller and its local supervisor use it too."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int | None = None) -> None:
    """A reader sees the old file or the new one, never half of one (also across threads and processes)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent))
    os.replace(tmp, path)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None when it is missing, half-written by a non-atomic writer, or not an object."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
