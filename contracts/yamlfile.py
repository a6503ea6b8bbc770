"""YAML files read with one-line errors: the trainer's config and search space, the controller's pools file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path, what: str, error: type[Exception] = ValueError) -> Any:
    """The parsed YAML (JSON is YAML) at `path`, or `error` with a one-line message naming `what` ("config file")."""
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as parse_error:
        raise error(f"{what} {path} is not valid YAML/JSON: {str(parse_error).splitlines()[0]}") from None
