"""Builders of real objects shared by the test suites."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from contracts.config import TrainConfig, build_config
from trainer.algo.batch import Batch
from trainer.algo.model import ModelDims, ParamLayout, ParamSpec
from trainer.algo.state import TrainState
from trainer.execution.plans._capture import WARMUP_STEPS

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
"""For the tests that run on a GPU machine only (`pytest -m gpu`, with their `gpu` mark)."""

on_the_interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a kernel on CPU tensors through Triton's interpreter; on a GPU its gpu tests"
)
"""For the tests that run a Triton kernel on CPU tensors: tests/conftest.py turns the interpreter on only
where there is no GPU."""


class FakeClock:
    """`time` for the trainer's loops (monkeypatched in as their module's `time`): `perf_counter` reads `now`,
    which only the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


TINY_MODEL = {
    "hidden": 32,
    "head_hidden": 16,
    "atoms": 11,
    "iqn_embed": 8,
    "iqn_hidden": 16,
    "iqn_taus": 4,
    "iqn_target_taus": 5,
    "iql_hidden": 8,
    "attn_window": 4,
    "attn_dim": 16,
    "attn_heads": 4,
    "attn_ffn": 24,
}
SMALL_MODEL = [
    "model.hidden=16",
    "model.head_hidden=8",
    "model.attn_ffn=8",
    "model.attn_dim=8",
    "model.iqn_taus=2",
    "model.iqn_target_taus=2",
    "model.attn_window=2",
]
"""Overrides for the smallest model the plan and bench tests build (capture and compilation stay quick)."""
SMALL_NETWORK = [
    "model.hidden=16",
    "model.head_hidden=8",
    "model.iqn_hidden=8",
    "model.iqn_embed=8",
    "model.iqn_taus=2",
    "model.iqn_target_taus=2",
]
"""The smallest network of a real training on the CPU (the recipes' own are far wider)."""
SMALL_CARTPOLE = [*SMALL_NETWORK, "data.learning_starts=32", "run.batch_size=16"]
"""Overrides for a real training (examples/cartpole.yaml) small enough for the CPU: the bench's and the pack's."""
SMALL_MARKET = [
    *SMALL_NETWORK,
    "model.attn_dim=8",
    "model.attn_ffn=8",
    "data.num_envs=4",
    "data.market_features=16",
    "data.market_horizon=16",
    "data.learning_starts=32",
    "data.epsilon_decay_steps=40",
    "replay.capacity=300",
    "run.batch_size=16",
    "run.collect_graph=false",
]
"""Overrides for examples/market.yaml (the torch market, HER on) small enough for the CPU: the pack's tests."""


def tiny_config(overrides: list[str] | None = None, **sections: dict[str, Any]) -> TrainConfig:
    """A config with every component on and tiny widths, for fast CPU tests."""
    data: dict[str, Any] = {
        "model": {**TINY_MODEL, "ensemble_heads": 2},
        "loss": {"vaccine": True, "causal": True},
        "replay": {"capacity": 256},
        "run": {"batch_size": 16, "device": "cpu", "steps": 20, "log_every": 10, "checkpoint_every": 10},
        "data": {"learning_starts": 32, "market_features": 16, "market_horizon": 16, "num_envs": 2},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return build_config(data, overrides)


def tiny_state(config: TrainConfig, obs_dim: int = 12, branches: int = 3, actions: int = 4) -> TrainState:
    dims = ModelDims.build(config.model, obs_dim, branches, actions)
    return TrainState.create(config, dims, torch.device("cpu"))


def random_batch(state: TrainState, batch_size: int, seed: int = 0) -> Batch:
    d = state.dims
    generator = torch.Generator().manual_seed(seed)
    batch = Batch.empty(batch_size, d.obs_dim, d.branches, d.attn_window, "cpu")
    batch.obs.normal_(generator=generator)
    batch.next_obs.normal_(generator=generator)
    batch.window.normal_(generator=generator)
    batch.reward.normal_(generator=generator)
    batch.action.random_(0, d.actions, generator=generator)
    batch.done.copy_((torch.rand(batch_size, generator=generator) < 0.2).float())
    batch.weight.uniform_(0.5, 1.0, generator=generator)
    return batch


def padded_layout() -> ParamLayout:
    """Matrices of every kind `ParamLayout` stores: plain, padded rows (`pad_out`), padded columns (a strided
    view), two in a group (stored out of spec order), beside a weight that is not a matrix and a LayerNorm."""
    return ParamLayout(
        [
            ParamSpec("a_w", (5, 7), 7, matrix=True),
            ParamSpec("a_b", (5,), 7),
            ParamSpec("ln_w", (6,), 0),
            ParamSpec("rows_w", (11, 6), 6, matrix=True, pad_dim=0),  # stored [16, 6]
            ParamSpec("rows_b", (11,), 6, pad_dim=0),
            ParamSpec("cols_w", (6, 13), 13, matrix=True, pad_dim=1),  # stored [6, 16]
            ParamSpec("plain_w", (9, 6), 6),  # not a matrix: spectral norm leaves it
            ParamSpec("e_w", (3, 7), 7, matrix=True),
            ParamSpec("e_b", (3,), 7),
        ],
        groups={"ae_w": ["a_w", "e_w"], "ae_b": ["a_b", "e_b"]},
    )


def matrix_mask(layout: ParamLayout) -> torch.Tensor:
    """[P] bool: the flat elements that some weight matrix's view reads (spectral norm's domain)."""
    mask = torch.zeros(layout.size, dtype=torch.bool)
    for spec in layout.matrices():
        layout.views(mask)[spec.name].fill_(True)
    return mask


def steps_with_kernels(config: TrainConfig, kernels: dict[str, Any], updates: int = 3) -> TrainState:
    """`updates` CPU training steps with the step's kernels swapped (`Hyper` fields, as a fused plan swaps them)
    beside the same steps as written: each update's losses and, at the end, every state tensor agree. The
    swapped run's state, for what the caller checks has trained."""
    from trainer.algo.step import Draws, Hyper, StepFlags, train_step

    reference, swapped = tiny_state(config), tiny_state(config)
    hp = Hyper.from_config(config)
    hp_kernels = dataclasses.replace(hp, **kernels)
    for step in range(updates):
        batch = random_batch(reference, 16, seed=step)
        draws = Draws.empty(reference.dims, 16, torch.device("cpu")).fill_(torch.Generator().manual_seed(step))
        want = train_step(reference, batch, draws, hp, StepFlags())
        got = train_step(swapped, batch, draws, hp_kernels, StepFlags())
        torch.testing.assert_close(got.losses, want.losses, rtol=1e-5, atol=1e-6)
    for name, tensor in reference.tensors().items():
        torch.testing.assert_close(swapped.tensors()[name], tensor, rtol=1e-4, atol=1e-6, msg=name)
    return swapped


class WarmedCapture:
    """A `CaptureFn` on the CPU that does what capturing does to state: the body runs `WARMUP_STEPS` times (the
    warm-up, on real data), and each replay runs it again."""

    def __init__(self) -> None:
        self.captured = 0

    def __call__(self, body: Callable[[], None], generators: Sequence[torch.Generator]) -> SimpleNamespace:
        for _ in range(WARMUP_STEPS):
            body()
        self.captured += 1
        return SimpleNamespace(replay=body)


def on_cuda_exploring(configs: list[TrainConfig]) -> list[TrainConfig]:
    """`configs` on cuda with every action random (ε = 1): a batched forward's rounding cannot flip a greedy pick,
    so a pack's GPU collection can be compared with its solo runs' bit for bit."""
    return [
        config.model_copy(
            update={
                "run": config.run.model_copy(update={"device": "cuda"}),
                "data": config.data.model_copy(update={"epsilon_start": 1.0, "epsilon_end": 1.0}),
            }
        )
        for config in configs
    ]


def compiled_without_the_interpreter(module: str, function: str, *args: Any) -> Any:
    """`module.function(*args)`'s JSON result in a Python of its own without TRITON_INTERPRET (which
    `tests/conftest.py` sets without a GPU), so Triton's own compiler and ptxas build kernels for a GPU this
    machine lacks: what the interpreter lets by fails there, not on the device."""
    code = f"import json, {module} as m; print(json.dumps(m.{function}(*{list(args)!r})))"
    compiled = subprocess.run(
        [sys.executable, "-c", code],
        env={name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    return json.loads(compiled.stdout.splitlines()[-1])
