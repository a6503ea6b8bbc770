"""Offline datasets of transitions in Parquet or .npz (schema: docs/datasets.md), via fsspec.

Every problem with a file (unreadable, missing column, wrong shape or dtype, NaN/inf, actions out
of range) is a `DatasetError` whose one-line message names the file and the problem, never its bytes.

A job's config carries the controller's `DatasetAccess` (`data.dataset_access`): the file must then lie
under an allowed root or URL scheme and be at most `max_bytes`, checked by stat or fsspec `info` before
a byte is read, and the read itself stops at the cap. Without one (a user's own run) any path or URL
is read. Either way only regular files are: a device, FIFO or directory is refused unopened.
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from contracts.config import env_id_problem
from contracts.datasets import DatasetAccess, DatasetRefused, check_local_file, local_path, locate
from trainer.execution.data.gym_source import GreedyFn, GymSource
from trainer.execution.data.spec import DatasetError, EnvSpec, Transitions, goal_columns

__all__ = ["DatasetError", "OfflineSource", "collect_dataset", "load_dataset", "write_dataset"]

REQUIRED = ("obs", "action", "reward", "next_obs", "done")
OPTIONAL = ("episode_step", "achieved_goal", "base_reward")
METADATA_KEY = "foxhunt"
"""Parquet schema-metadata key / .npz array name of the JSON metadata {num_actions, env_id, env_kwargs}."""


@dataclass
class Dataset:
    """Validated arrays (column -> [N, ...] NumPy array) and the file's metadata."""

    path: str
    arrays: dict[str, np.ndarray]
    metadata: dict[str, Any]

    def __len__(self) -> int:
        return int(self.arrays["obs"].shape[0])

    def transitions(self, spec: EnvSpec) -> Transitions:
        """All rows as CPU tensors; goal columns computed from the spec's goal if the file has none."""
        a = self.arrays
        rows = Transitions(
            obs=torch.from_numpy(a["obs"].astype(np.float32)),
            action=torch.from_numpy(a["action"].astype(np.int64).reshape(len(self), -1)),
            reward=torch.from_numpy(a["reward"].astype(np.float32)),
            next_obs=torch.from_numpy(a["next_obs"].astype(np.float32)),
            done=torch.from_numpy(a["done"].astype(np.float32)),
            last=torch.from_numpy(a["done"].astype(bool)),
            episode_step=torch.from_numpy(a["episode_step"].astype(np.int64)) if "episode_step" in a else None,
        )
        if spec.goal is not None:
            if "achieved_goal" in a and "base_reward" in a:
                rows.achieved_goal = torch.from_numpy(a["achieved_goal"].astype(np.float32))
                rows.base_reward = torch.from_numpy(a["base_reward"].astype(np.float32))
            else:
                rows.achieved_goal, rows.base_reward = goal_columns(spec, rows.obs, rows.next_obs, rows.reward)
        return rows


def _fail(path: str, problem: str) -> DatasetError:
    return DatasetError(f"dataset {path}: {problem}")


def _parquet_column(path: str, table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name).combine_chunks()
    if column.null_count:
        raise _fail(path, f"column {name!r} has {column.null_count} null values")
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type):
        lengths = pa.compute.list_value_length(column).to_numpy(zero_copy_only=False)
        if lengths.size and (lengths != lengths[0]).any():
            raise _fail(path, f"column {name!r} has rows of different lengths ({lengths.min()}..{lengths.max()})")
        values = column.flatten()
        if values.null_count:
            raise _fail(path, f"column {name!r} has null values inside its lists")
        width = int(lengths[0]) if lengths.size else 0
        return values.to_numpy(zero_copy_only=False).reshape(len(column), width)
    return column.to_numpy(zero_copy_only=False)


def _read_bytes(path: str, access: DatasetAccess | None) -> bytes:
    """The file's bytes, if `access` allows it (None: any path or URL) and it is a regular file within the cap."""
    try:
        if access is None:
            local, target, cap = local_path(path), path, None
        else:
            location = locate(path, access)
            local, target, cap = (location.target if location.local else None), location.target, access.max_bytes
        if local is not None:
            return _read_local(path, local, cap)
        return _read_url(path, target, cap)
    except DatasetRefused as error:
        raise DatasetError(str(error)) from None
    except FileNotFoundError:
        raise _fail(path, "file not found") from None


def _read_local(path: str, local: str, cap: int | None) -> bytes:
    """Checked by stat first, then opened without following a last-moment symlink, and read up to the cap."""
    checked = check_local_file(path, local, cap)
    try:
        fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise _fail(path, f"cannot open ({error.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        opened = os.fstat(handle.fileno())
        if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino) or not stat.S_ISREG(opened.st_mode):
            raise _fail(path, "the file changed while it was opened")
        return _bounded(path, handle, cap)


def _read_url(path: str, url: str, cap: int | None) -> bytes:
    """Its size from fsspec `info` (a HEAD request over HTTP) before the read, which stops at the cap."""
    try:
        fs, target = fsspec.core.url_to_fs(url)
        info = fs.info(target)
        if info.get("type") != "file":
            raise _fail(path, "is not a file")
        size = info.get("size")
        if cap is not None and size is None:
            raise _fail(path, f"its size is unknown, and datasets here are limited to {cap} bytes")
        if cap is not None and size > cap:
            raise _fail(path, f"is {size} bytes, over the limit of {cap}")
        with fs.open(target, "rb") as handle:
            return _bounded(path, handle, cap)
    except (FileNotFoundError, DatasetError):
        raise
    except (OSError, ValueError, ImportError) as error:
        # the type only: a server's or library's message may quote what it read
        raise _fail(path, f"cannot open ({type(error).__name__})") from None


def _bounded(path: str, handle: Any, cap: int | None) -> bytes:
    raw: bytes = handle.read() if cap is None else handle.read(cap + 1)
    if cap is not None and len(raw) > cap:
        raise _fail(path, f"is over the limit of {cap} bytes (it grew after its size was checked)")
    return raw


def _read(path: str, access: DatasetAccess | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    raw = _read_bytes(path, access)
    # errors name the library's exception type only: their messages may quote the file's bytes
    if raw[:4] == b"PAR1":
        try:
            table = pq.read_table(io.BytesIO(raw))
        except (pa.ArrowException, OSError) as error:
            raise _fail(path, f"not a readable Parquet file ({type(error).__name__})") from None
        meta = (table.schema.metadata or {}).get(METADATA_KEY.encode())
        arrays = {name: _parquet_column(path, table, name) for name in table.column_names}
        return arrays, _metadata(path, meta.decode() if meta else None)
    if raw[:4] == b"PK\x03\x04":
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (ValueError, OSError, zipfile.BadZipFile) as error:
            raise _fail(path, f"not a readable .npz file ({type(error).__name__})") from None
        meta_array = arrays.pop(METADATA_KEY, None)
        return arrays, _metadata(path, str(meta_array) if meta_array is not None else None)
    raise _fail(path, "not a Parquet or .npz file (neither format's signature at its start)")


def _metadata(path: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        meta = json.loads(text)
    except json.JSONDecodeError:
        raise _fail(path, f"metadata {METADATA_KEY!r} is not JSON") from None
    if not isinstance(meta, dict):
        raise _fail(path, f"metadata {METADATA_KEY!r} must be a JSON object")
    return meta


def validate(path: str, arrays: Mapping[str, np.ndarray], num_actions: int) -> dict[str, np.ndarray]:
    """Check the schema; returns the known columns (action as [N, K]). Raises DatasetError."""
    for name in REQUIRED:
        if name not in arrays:
            raise _fail(path, f"missing column {name!r} (required: {', '.join(REQUIRED)})")
    out = {name: np.asarray(arrays[name]) for name in (*REQUIRED, *OPTIONAL) if name in arrays}
    n = out["obs"].shape[0] if out["obs"].ndim else 0
    if n == 0:
        raise _fail(path, "has no rows")
    want_dims = {
        "obs": 2,
        "next_obs": 2,
        "reward": 1,
        "done": 1,
        "episode_step": 1,
        "base_reward": 1,
        "achieved_goal": 2,
    }
    if out["action"].ndim == 1:
        out["action"] = out["action"][:, None]
    want_dims["action"] = 2
    for name, value in out.items():
        if value.ndim != want_dims[name] or value.shape[0] != n:
            rows = "[N, ...]" if want_dims[name] == 2 else "[N]"
            raise _fail(path, f"column {name!r} has shape {list(value.shape)}, expected {rows} with N = {n}")
    if out["next_obs"].shape != out["obs"].shape:
        raise _fail(path, f"next_obs has shape {list(out['next_obs'].shape)} but obs has {list(out['obs'].shape)}")
    for name in ("obs", "next_obs", "reward", "base_reward", "achieved_goal"):
        if name in out:
            if out[name].dtype.kind != "f":
                raise _fail(path, f"column {name!r} has dtype {out[name].dtype}, expected float")
            if not np.isfinite(out[name]).all():
                raise _fail(path, f"column {name!r} contains NaN or inf")
    for name in ("action", "episode_step"):
        if name in out and out[name].dtype.kind not in "iu":
            raise _fail(path, f"column {name!r} has dtype {out[name].dtype}, expected integer")
    low, high = int(out["action"].min()), int(out["action"].max())
    if low < 0 or high >= num_actions:
        raise _fail(path, f"action values must be in [0, {num_actions}), found {low}..{high}")
    done = out["done"]
    if done.dtype.kind not in "biuf" or not np.isin(done, (0, 1)).all():
        raise _fail(path, f"column 'done' must hold only 0/1 (or booleans), got dtype {done.dtype}")
    if "episode_step" in out and out["episode_step"].min() < 0:
        raise _fail(path, "column 'episode_step' has negative values")
    return out


def dataset_spec(dataset: Dataset) -> EnvSpec:
    """The EnvSpec: from the env named in the metadata if any (goal included), else from the arrays."""
    meta = dataset.metadata
    obs_dim = dataset.arrays["obs"].shape[1]
    branches = dataset.arrays["action"].shape[1]
    if meta.get("env_id"):
        from trainer.execution.data.gym_source import env_spec, make_env_fn

        env = make_env_fn(meta["env_id"], meta.get("env_kwargs"))()
        spec = env_spec(env, meta["env_id"])
        env.close()
        if (spec.obs_dim, spec.branches) != (obs_dim, branches):
            raise _fail(
                dataset.path,
                f"obs/action widths ({obs_dim}, {branches}) do not match env {meta['env_id']} "
                f"({spec.obs_dim}, {spec.branches})",
            )
        return spec
    return EnvSpec(obs_dim=obs_dim, branches=branches, actions=int(meta["num_actions"]))


def load_dataset(path: str, access: DatasetAccess | None = None) -> Dataset:
    """Read and validate a dataset from a local path or an fsspec URL (one that `access` allows, if given)."""
    arrays, meta = _read(path, access)
    problem = env_id_problem(meta["env_id"]) if meta.get("env_id") else None
    if problem is not None:  # before anything gives it to Gymnasium (the id itself is the file's, not quoted)
        raise _fail(path, f"metadata env_id {problem}")
    if "num_actions" not in meta and not meta.get("env_id"):
        raise _fail(path, f"metadata {METADATA_KEY!r} must give num_actions or env_id (see docs/datasets.md)")
    num_actions = meta.get("num_actions")
    dataset = Dataset(path, dict(arrays), meta)
    if num_actions is None:
        dataset.arrays = validate(path, arrays, 1 << 62)
        spec = dataset_spec(dataset)
        num_actions = spec.actions
    if not isinstance(num_actions, int) or num_actions < 2:
        shown = num_actions if isinstance(num_actions, int) else f"a {type(num_actions).__name__}"
        raise _fail(path, f"metadata num_actions must be an integer >= 2, got {shown}")
    dataset.metadata = {**meta, "num_actions": num_actions}
    dataset.arrays = validate(path, arrays, num_actions)
    return dataset


def write_dataset(
    path: str,
    arrays: Mapping[str, np.ndarray],
    *,
    num_actions: int,
    env_id: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> None:
    """Validate `arrays` and write them to `path` (.parquet or .npz by suffix; any fsspec URL)."""
    columns = validate(path, arrays, num_actions)
    meta = json.dumps({"num_actions": num_actions, "env_id": env_id, "env_kwargs": env_kwargs or {}})
    if path.endswith(".npz"):
        buffer = io.BytesIO()
        members: dict[str, Any] = {**columns, METADATA_KEY: np.array(meta)}
        np.savez_compressed(buffer, **members)
        payload = buffer.getvalue()
    elif path.endswith((".parquet", ".pq")):
        fields = {}
        for name, value in columns.items():
            if value.ndim == 2:
                flat = pa.array(np.ascontiguousarray(value).reshape(-1))
                fields[name] = pa.FixedSizeListArray.from_arrays(flat, value.shape[1])
            else:
                fields[name] = pa.array(value)
        table = pa.table(fields).replace_schema_metadata({METADATA_KEY: meta})
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        payload = sink.getvalue().to_pybytes()
    else:
        raise _fail(path, "unknown format: the name must end in .parquet, .pq or .npz")
    with fsspec.open(path, "wb") as handle:
        handle.write(payload)


def collect_dataset(
    source: GymSource, steps: int, greedy_fn: GreedyFn | None, epsilon: float, generator: torch.Generator
) -> dict[str, np.ndarray]:
    """Run `steps` collection steps of `source` and return the rows episode by episode (schema columns).

    Parallel envs interleave their rows; a dataset stores each episode's rows contiguously, so rows
    are grouped per env and emitted when the episode ends (unfinished episodes come last).
    """
    blocks = [source.collect(greedy_fn, epsilon, generator) for _ in range(steps)]
    n = source.num_envs
    last = torch.cat([b.last for b in blocks]).numpy()  # [T*N], time-major: row = t*N + env
    env = np.tile(np.arange(n), steps)
    # episode number of each row within its env, then a rank: finished episodes by end time, then the rest
    episode = np.zeros(last.size, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    for t in range(steps):
        episode[t * n : (t + 1) * n] = count
        count += last[t * n : (t + 1) * n]
    key = env * (steps + 1) + episode
    rank = {int(k): i for i, k in enumerate(key[last])}
    unfinished = len(rank) + key  # after every finished episode, by env then episode
    order = np.argsort([rank.get(int(k), int(u)) for k, u in zip(key, unfinished, strict=True)], kind="stable")
    names = ["obs", "action", "reward", "next_obs", "done", "episode_step"]
    if source.spec.goal is not None:
        names += ["achieved_goal", "base_reward"]
    out = {}
    for name in names:
        parts = [getattr(b, name) for b in blocks]
        out[name] = torch.cat([p.cpu() for p in parts if p is not None]).numpy()[order]
    return out


class OfflineSource:
    """Transitions from a dataset file; evaluation runs in the env its metadata names, if any."""

    def __init__(self, path: str, device: torch.device | str, access: DatasetAccess | None = None) -> None:
        self.dataset = load_dataset(path, access)
        self.spec = dataset_spec(self.dataset)
        self.device = torch.device(device)

    def transitions(self) -> Transitions:
        """Every row (CPU tensors), for `ReplayBuffer.extend`."""
        return self.dataset.transitions(self.spec)

    def close(self) -> None:
        """Nothing to release: evaluation's envs are closed after each evaluation."""

    def evaluate(self, greedy_fn: GreedyFn, episodes: int, seed: int) -> list[float]:
        """Greedy returns in the dataset's env (metadata env_id); a DatasetError if it names none."""
        env_id = self.dataset.metadata.get("env_id")
        if not env_id:
            raise _fail(self.dataset.path, "cannot evaluate: its metadata names no env_id")
        source = GymSource(env_id, 1, seed, self.device, self.dataset.metadata.get("env_kwargs"))
        try:
            return source.evaluate(greedy_fn, episodes, seed)
        finally:
            source.close()
