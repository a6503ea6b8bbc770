"""Where a job's offline dataset may come from: the admin's roots and URL schemes, and a size cap.

The controller checks a submission against them before storing it (422), and the trainer checks
again when it opens the file (`trainer/execution/data/offline.py`), since a path may change in
between. A tenant who could name any path or URL could have the trainer read the controller's files
(`/etc/shadow`, `/dev/zero`) or fetch from its network (`http://127.0.0.1:…`): nothing is allowed
unless an admin allowed it. Only names and filesystem metadata (realpath, stat) are looked at here,
never a file's contents and never the network, so the controller can run it too.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_MAX_BYTES = 1 << 30
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class DatasetRefused(ValueError):
    """The dataset is not in an allowed place, or not a file the trainer may read; one line, no contents."""


def url_scheme(dataset: str) -> str | None:
    """The URL scheme, lower-cased (`s3`, `file`), or None for a plain path."""
    match = _SCHEME.match(dataset)
    return match.group(1).lower() if match else None


def local_path(dataset: str) -> str | None:
    """The local path a dataset names (a plain path or a `file://` URL), or None for a remote URL."""
    scheme = url_scheme(dataset)
    if scheme is None:
        return dataset
    return dataset[len("file://") :] if scheme == "file" else None


class DatasetAccess(BaseModel):
    """What the controller's admin allows (its settings); the trainer gets it in `data.dataset_access`.

    Empty roots and schemes allow no dataset at all."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    roots: tuple[str, ...] = Field(
        (),
        max_length=64,
        description=(
            "Absolute local directories, or URL prefixes (`s3://bucket/datasets/`), that datasets may come from; "
            "a local path must resolve (symlinks and `..` followed) to a file inside one."
        ),
    )
    schemes: tuple[str, ...] = Field(
        (),
        max_length=16,
        description="URL schemes any URL of which is allowed (`s3`, `gs`); `file` is not one: list local roots.",
    )
    max_bytes: int = Field(
        DEFAULT_MAX_BYTES, ge=1, le=1 << 40, description="Largest dataset file read, checked before reading it."
    )

    @field_validator("roots")
    @classmethod
    def _roots(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        for root in roots:
            scheme = url_scheme(root)
            if scheme is None and not os.path.isabs(root):
                raise ValueError(f"dataset root {root!r} must be an absolute directory or a URL prefix")
            if scheme == "file":
                raise ValueError(f"dataset root {root!r}: give a local directory as a plain absolute path")
            if scheme is not None and not urlsplit(root).netloc:
                raise ValueError(f"dataset root {root!r} must name a host or bucket")
        return roots

    @field_validator("schemes")
    @classmethod
    def _schemes(cls, schemes: tuple[str, ...]) -> tuple[str, ...]:
        for scheme in schemes:
            if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme):
                raise ValueError(f"dataset scheme {scheme!r} must be a lower-case URL scheme such as 's3'")
            if scheme == "file":
                raise ValueError("'file' would allow every local file: list local dataset roots instead")
        return schemes

    def allowed(self) -> str:
        """The allowed places, for messages."""
        if not self.roots and not self.schemes:
            return "no dataset is allowed here (no dataset roots or URL schemes are configured)"
        places = [f"under {root}" for root in self.roots] + [f"{scheme}:// URLs" for scheme in self.schemes]
        return "datasets may come from " + "; ".join(places)


@dataclass(frozen=True)
class DatasetLocation:
    """Where an allowed dataset is read: a local path with every symlink resolved, or a remote URL."""

    target: str
    local: bool


def locate(dataset: str, access: DatasetAccess) -> DatasetLocation:
    """The place `dataset` is read from if `access` allows it; DatasetRefused (naming what is allowed) if not."""
    if "::" in dataset:
        raise DatasetRefused(f"dataset {dataset!r}: chained URLs (`::`) are not allowed; {access.allowed()}")
    path = local_path(dataset)
    if path is not None:
        if not os.path.isabs(path):
            raise DatasetRefused(f"dataset {dataset!r} must be an absolute path; {access.allowed()}")
        real = os.path.realpath(path)
        for root in access.roots:
            if url_scheme(root) is None and _inside(real, os.path.realpath(root)):
                return DatasetLocation(real, local=True)
        raise DatasetRefused(f"dataset {dataset!r} is outside the allowed places (links followed); {access.allowed()}")
    if url_scheme(dataset) in access.schemes:
        return DatasetLocation(dataset, local=False)
    segments = unquote(urlsplit(dataset).path).split("/")
    if "." not in segments and ".." not in segments:
        for root in access.roots:
            if url_scheme(root) is not None and dataset.startswith(root.rstrip("/") + "/"):
                return DatasetLocation(dataset, local=False)
    raise DatasetRefused(f"dataset {dataset!r} is not in an allowed place; {access.allowed()}")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def check_local_file(dataset: str, path: str, max_bytes: int | None) -> os.stat_result:
    """stat `path` (no byte read): a regular file within `max_bytes`, else DatasetRefused.

    FileNotFoundError propagates: the caller decides whether a file that is not there yet is an error."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise DatasetRefused(f"dataset {dataset!r}: cannot read it ({error.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise DatasetRefused(f"dataset {dataset!r} is not a regular file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise DatasetRefused(f"dataset {dataset!r} is {info.st_size} bytes, over the limit of {max_bytes}")
    return info
