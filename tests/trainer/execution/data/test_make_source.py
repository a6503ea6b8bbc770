"""make_source: the config picks the source."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gymnasium.vector import AsyncVectorEnv

from contracts.config import build_config
from trainer.execution.data import make_source
from trainer.execution.data.gym_source import GymSource
from trainer.execution.data.market import GOAL
from trainer.execution.data.offline import DatasetError, OfflineSource, write_dataset

from .test_offline import columns


def test_market_is_the_default_source() -> None:
    source = make_source(build_config({"data": {"num_envs": 2, "market_features": 32, "market_horizon": 16}}))
    assert isinstance(source, GymSource) and source.num_envs == 2
    spec = source.spec
    assert (spec.obs_dim, spec.branches, spec.actions) == (32, 3, 5)
    assert spec.goal is not None and spec.goal.desired == GOAL
    rows = source.collect(None, 1.0, torch.Generator().manual_seed(0))
    assert rows.obs.shape == (2, 32) and rows.achieved_goal is not None


def test_gym_and_offline_sources(tmp_path: Path) -> None:
    gym_source = make_source(build_config({"data": {"source": "gym", "env_id": "CartPole-v1"}}))
    assert gym_source.spec.obs_dim == 4
    workers = make_source(build_config({"data": {"source": "gym", "num_envs": 2, "vector_env": "async"}}))
    assert isinstance(workers, GymSource) and isinstance(workers.envs, AsyncVectorEnv)
    workers.close()
    path = str(tmp_path / "d.npz")
    write_dataset(path, columns(), num_actions=5)
    offline = make_source(build_config({"data": {"source": "offline", "dataset": path}}))
    assert isinstance(offline, OfflineSource) and offline.spec.actions == 5
    with pytest.raises(DatasetError, match="file not found"):
        make_source(build_config({"data": {"source": "offline", "dataset": str(tmp_path / "none.npz")}}))


def test_the_offline_source_reads_only_where_the_configs_dataset_access_allows(tmp_path: Path) -> None:
    """The controller puts its rules in data.dataset_access; the trainer enforces them, not an environment variable."""
    inside, outside = tmp_path / "sets", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    for folder in (inside, outside):
        write_dataset(str(folder / "d.npz"), columns(), num_actions=5)
    access = {"roots": [str(inside)], "max_bytes": 1 << 20}
    allowed = build_config({"data": {"source": "offline", "dataset": str(inside / "d.npz"), "dataset_access": access}})
    assert isinstance(make_source(allowed), OfflineSource)
    refused = build_config({"data": {"source": "offline", "dataset": str(outside / "d.npz"), "dataset_access": access}})
    with pytest.raises(DatasetError, match=f"outside the allowed places.*under {inside}"):
        make_source(refused)
