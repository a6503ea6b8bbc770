"""Sources of transitions: Gymnasium envs, the built-in market, offline datasets.

Sources are built by `make_source(config)`; their modules import gymnasium/pyarrow, so they load
only when a source is made (importing `trainer.execution.data` stays light and side-effect free).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from contracts.config import ConfigError, TrainConfig
from trainer.execution.data.spec import DatasetError, EnvSpec, GoalSpec, Transitions

if TYPE_CHECKING:
    from trainer.execution.data.gym_source import GreedyFn

__all__ = ["DatasetError", "EnvSpec", "GoalSpec", "OnlineSource", "Source", "Transitions", "make_source"]


class Source(Protocol):
    """Anything the trainer learns from: a spec, and greedy evaluation returns."""

    spec: EnvSpec

    def evaluate(self, greedy_fn: GreedyFn, episodes: int, seed: int) -> list[float]: ...

    def close(self) -> None:
        """Release what it holds (envs, worker processes) once training is done with it."""
        ...


class OnlineSource(Source, Protocol):
    """A source that collects: one step of every parallel env per call (`num_envs` rows)."""

    num_envs: int
    finished_returns: list[float]

    def collect(self, greedy_fn: GreedyFn | None, epsilon: float, generator: torch.Generator) -> Transitions: ...


def make_source(config: TrainConfig, device: torch.device | str = "cpu") -> Source:
    """The source `config.data.source` names (market and gym are online, offline is a dataset file).

    The market runs as torch tensors on `device` (`TorchMarketSource`) or as a Gymnasium env on the
    host, as `data.market_backend` says.
    """
    data = config.data
    if data.source == "offline":
        from trainer.execution.data.offline import OfflineSource

        if not data.dataset:
            raise ConfigError("data.dataset is required when data.source is 'offline'")
        return OfflineSource(data.dataset, device, data.dataset_access)
    from trainer.execution.data.gym_source import GymSource

    if data.source == "market":
        from trainer.execution.data.market import ENV_ID

        if data.market_backend == "torch" or (data.market_backend == "auto" and torch.device(device).type == "cuda"):
            from trainer.execution.data.market_torch import TorchMarketSource

            return TorchMarketSource(
                data.num_envs,
                config.run.seed,
                device,
                features=data.market_features,
                horizon=data.market_horizon,
                rng=config.run.rng,
            )
        kwargs = {"features": data.market_features, "horizon": data.market_horizon}
        return GymSource(ENV_ID, data.num_envs, config.run.seed, device, kwargs, vector=data.vector_env)
    return GymSource(data.env_id, data.num_envs, config.run.seed, device, vector=data.vector_env)
