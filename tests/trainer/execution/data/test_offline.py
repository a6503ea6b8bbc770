"""Offline datasets: round trips, one-line errors for malformed files, collection order."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from contracts.config import build_config
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data.gym_source import GymSource
from trainer.execution.data.offline import DatasetError, OfflineSource, collect_dataset, load_dataset, write_dataset

from .conftest import MULTI_ID


def columns(n: int = 12, f: int = 3, k: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    step = np.arange(n) % 4
    return {
        "obs": rng.normal(size=(n, f)).astype(np.float32),
        "action": rng.integers(0, 5, (n, k)),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, f)).astype(np.float32),
        "done": (step == 3).astype(np.float32),
        "episode_step": step,
    }


@pytest.mark.parametrize("suffix", [".parquet", ".npz"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    path = str(tmp_path / f"data{suffix}")
    arrays = columns()
    write_dataset(path, arrays, num_actions=5)
    dataset = load_dataset(path)
    assert dataset.metadata["num_actions"] == 5 and len(dataset) == 12
    for name, value in arrays.items():
        np.testing.assert_array_equal(dataset.arrays[name], value)
    source = OfflineSource(path, "cpu")
    assert (source.spec.obs_dim, source.spec.branches, source.spec.actions) == (3, 2, 5)
    rows = source.transitions()
    assert rows.action.shape == (12, 2) and torch.equal(rows.last, torch.from_numpy(arrays["done"] == 1))
    with pytest.raises(DatasetError, match="cannot evaluate: its metadata names no env_id"):
        source.evaluate(lambda obs: obs, 1, 0)


def test_fsspec_url_and_single_branch_actions() -> None:
    arrays = columns(k=1)
    arrays["action"] = arrays["action"][:, 0]  # [N] for K = 1
    write_dataset("memory://datasets/one.npz", arrays, num_actions=5)
    dataset = load_dataset("memory://datasets/one.npz")
    assert dataset.arrays["action"].shape == (12, 1)


def npz_bytes(arrays: dict[str, np.ndarray], meta: str = '{"num_actions": 5}') -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, foxhunt=np.array(meta))
    return buffer.getvalue()


def edit(**changes: object) -> Callable[[dict[str, np.ndarray]], None]:
    def apply(arrays: dict[str, np.ndarray]) -> None:
        for name, value in changes.items():
            if value is None:
                del arrays[name]
            else:
                arrays[name] = value(arrays[name]) if callable(value) else value  # type: ignore[assignment]

    return apply


MALFORMED = [
    (edit(reward=None), "missing column 'reward'"),
    (edit(next_obs=lambda a: a[:, :2]), r"next_obs has shape \[12, 2\] but obs has \[12, 3\]"),
    (edit(reward=lambda a: a[:, None]), r"column 'reward' has shape \[12, 1\], expected \[N\] with N = 12"),
    (edit(done=lambda a: a[:5]), r"column 'done' has shape \[5\], expected \[N\] with N = 12"),
    (edit(obs=lambda a: a.astype(np.int64)), "column 'obs' has dtype int64, expected float"),
    (edit(action=lambda a: a.astype(np.float32)), "column 'action' has dtype float32, expected integer"),
    (edit(reward=lambda a: np.where(np.arange(12) == 3, np.nan, a)), "column 'reward' contains NaN or inf"),
    (edit(action=lambda a: a + 3), r"action values must be in \[0, 5\), found 3..7"),
    (edit(done=lambda a: a * 2), "column 'done' must hold only 0/1"),
    (edit(episode_step=lambda a: a - 1), "column 'episode_step' has negative values"),
    (edit(obs=lambda a: a[:0], next_obs=lambda a: a[:0]), "has no rows"),
]


@pytest.mark.parametrize(("change", "message"), MALFORMED)
@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_malformed_files_give_one_line_errors(
    tmp_path: Path, suffix: str, change: Callable[[dict[str, np.ndarray]], None], message: str
) -> None:
    arrays = columns()
    change(arrays)
    path = tmp_path / f"bad{suffix}"
    if suffix == ".npz":
        path.write_bytes(npz_bytes(arrays))
    elif len({len(v) for v in arrays.values()}) > 1:
        pytest.skip("a Parquet table cannot hold columns of different lengths")
    else:
        fields = {
            name: pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]) if v.ndim == 2 else pa.array(v)
            for name, v in arrays.items()
        }
        pq.write_table(pa.table(fields).replace_schema_metadata({"foxhunt": '{"num_actions": 5}'}), path)
    with pytest.raises(DatasetError, match=message) as error:
        load_dataset(str(path))
    assert "\n" not in str(error.value) and str(error.value).startswith(f"dataset {path}: ")
    with pytest.raises(DatasetError, match=message):  # the writer validates the same way
        write_dataset(str(tmp_path / f"out{suffix}"), arrays, num_actions=5)


def test_unreadable_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.parquet"
    text.write_text("obs,action\n1,2\n")
    with pytest.raises(DatasetError, match=r"not a Parquet or .npz file \(starts with b'obs,'\)"):
        load_dataset(str(text))
    with pytest.raises(DatasetError, match="file not found"):
        load_dataset(str(tmp_path / "missing.npz"))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1" + b"\0" * 20)
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_dataset(str(broken))
    no_meta = tmp_path / "no_meta.npz"
    no_meta.write_bytes(npz_bytes(columns(), meta="[1]"))
    with pytest.raises(DatasetError, match="must be a JSON object"):
        load_dataset(str(no_meta))
    buffer = io.BytesIO()
    np.savez(buffer, **columns())
    (tmp_path / "bare.npz").write_bytes(buffer.getvalue())
    with pytest.raises(DatasetError, match="must give num_actions or env_id"):
        load_dataset(str(tmp_path / "bare.npz"))
    ragged = pa.table(
        {
            "obs": pa.array([[1.0, 2.0], [1.0]]),
            "action": pa.array([0, 1]),
            "reward": pa.array([0.0, 0.0]),
            "next_obs": pa.array([[1.0, 2.0], [1.0, 2.0]]),
            "done": pa.array([False, True]),
        }
    ).replace_schema_metadata({"foxhunt": '{"num_actions": 2}'})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    with pytest.raises(DatasetError, match="column 'obs' has rows of different lengths"):
        load_dataset(str(tmp_path / "ragged.parquet"))
    with pytest.raises(DatasetError, match="unknown format"):
        write_dataset(str(tmp_path / "data.csv"), columns(), num_actions=5)


def test_collected_dataset_keeps_episodes_contiguous_and_loads_into_replay(tmp_path: Path) -> None:
    source = GymSource(MULTI_ID, 3, 0, "cpu")
    arrays = collect_dataset(source, 20, None, 1.0, torch.Generator().manual_seed(0))
    assert len(arrays["obs"]) == 60
    step, done = arrays["episode_step"], arrays["done"]
    restart = np.flatnonzero(step[1:] != step[:-1] + 1) + 1
    assert (step[restart] == 0).all() and step[0] == 0  # every episode is contiguous, from its step 0
    np.testing.assert_array_equal(arrays["next_obs"][:, 0], step + 1)  # t of the env, per episode
    assert done.sum() > 0

    path = str(tmp_path / "toy.parquet")
    write_dataset(path, arrays, num_actions=3, env_id=MULTI_ID)
    offline = OfflineSource(path, "cpu")
    assert (offline.spec.obs_dim, offline.spec.branches, offline.spec.actions) == (2, 2, 3)
    config = build_config({"replay": {"capacity": 128}, "run": {"batch_size": 16}, "data": {"num_envs": 3}})
    buffer = ReplayBuffer(config, offline.spec, "cpu", torch.Generator().manual_seed(0))
    buffer.extend(offline.transitions())
    assert len(buffer) == 60
    np.testing.assert_array_equal(buffer.storage.episode_step[:60].numpy(), step)
    assert offline.evaluate(lambda obs: torch.full((obs.shape[0], 2), 2), 2, seed=0) == [4.0, 4.0]


def test_env_metadata_must_match_the_arrays(tmp_path: Path) -> None:
    path = str(tmp_path / "wrong.npz")
    write_dataset(path, columns(), num_actions=5, env_id=MULTI_ID)  # obs width 3, env has 2
    with pytest.raises(DatasetError, match=r"widths \(3, 2\) do not match env foxhunt-test/MultiToy-v0 \(2, 2\)"):
        OfflineSource(path, "cpu")
