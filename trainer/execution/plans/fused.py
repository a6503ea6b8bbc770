"""The fused plan: Inductor-fused kernels and TF32, captured into the dual plan's multi-stream graph.

`train_step` runs through `torch.compile` (Inductor, no CUDA graphs of its own) and the graph plan's
capture then records the generated kernels, with the dual plan's side-stream forks, into one CUDA
graph per variant. Because the step takes its gradients with `torch.func` (no `autograd.grad` calls
for Dynamo to break at), the main network's targets, forward and backward (the heads' batched
backward and IQN's own) are one Inductor graph: its pointwise work is fused into the matrix
products' neighbours. The router's stream sections (attention, IQL, the guard's join) are
eager calls (`torch.compiler.disable`) that Dynamo breaks around; it cannot resume inside their
`with` blocks, so it runs the rest of `train_step` as Python and compiles each call it makes: the
step writes each section's work as one call (`trainer.algo.step.iql_update`, `main_update`, …), so each is
one graph and no tensor op runs outside a graph (`scripts/kernel_count.py --as-plan`: 5 graphs).

The replay's work in each update is compiled too (`compile_replay_ops`): sampling without its random
numbers (the search, weights, gathers and HER's relabelling, `ReplayBuffer.gather_into`) and the
priority write-back, each one Inductor graph, so that inside the captured graph only the draws
(`torch.rand` with a generator, which Dynamo does not trace) remain eager kernels.

Matrix products run in TF32 (captured as such; eager code elsewhere stays float32). Tolerance
against the float32 eager step, stated by the equivalence test: every state tensor within a relative
error of `TF32_RTOL` after 50 steps, and loss curves agreeing over 2000 steps.

The attention model's self-attention runs as two Triton kernels (`trainer.execution.kernels.window_attention`,
one program per window and head) where its window and head size fit them: SDPA's flash kernels run the
pinned 16-state windows in mostly empty tiles.

With `run.precision=bf16` the networks' matrix products and attention run in bf16 (autocast inside
`train_step`; the output layers too, their outputs cast to
float32), with float32 master weights, gradients, Adam, spectral norm, C51 projection and losses, and
TF32 for the float32 products left. Tolerance:
`BF16_RTOL` per state tensor after 50 steps, and the same 2000-step loss-curve check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from contracts.config import TrainConfig
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.step import Hyper, SectionTimer, StepFlags, StepOutput, train_step
from trainer.execution.plans._capture import StreamRouter
from trainer.execution.plans.dual import DualStreamPlan

TF32_RTOL = 2e-2
"""Relative error per state tensor (‖plan − eager‖ / ‖eager‖) allowed for TF32 plans after 50 steps."""

BF16_RTOL = 1e-1
"""The same for `run.precision=bf16` (8-bit mantissa operands). Measured on the CPU, 50 steps of the pinned
`core` model (B = 256) against float32: parameters within 1.9e-3, Adam moments within 4.8e-2 (IQL's first
moment: its residuals are small differences of values); twice that is allowed. With the output layers in
bf16 too (round 3): parameters within 2.1e-3, Adam moments within 4.7e-2 (the same IQL moment)."""

COMPILE_MODE: str | None = None
"""Inductor's default mode: fused kernels, no CUDA graphs of its own (this plan captures the graph
itself); "max-autotune-no-cudagraphs" tunes the matrix products too, at minutes of compile time."""

HORIZONTAL_OPTIONS: dict[str, Any] = {"combo_kernels": True, "benchmark_combo_kernel": True}
"""Inductor options of a plan under `run.combo_kernels` (the bench's `+combo` methods): independent small
Triton kernels (round 2's profile: 225 per step, most a few µs of launch and tail inside the graph) are
launched as combined kernels, kept only where Inductor's benchmark finds the combination faster. Triton
only: Inductor's CPU code is the same with or without them. The replay's compiled work takes them too."""


class _EagerSections:
    """The router's stream sections as opaque calls, so Dynamo breaks around them instead of tracing
    stream switches; every other section is a no-op it traces through (one graph for the main work)."""

    def __init__(self, router: StreamRouter) -> None:
        self.router = router

    def section(self, name: str) -> contextlib.AbstractContextManager[None]:
        if name in self.router.FORKS or name in self.router.JOINS:
            return self._routed(name)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _routed(self, name: str) -> Iterator[None]:
        manager = self.router.section(name)
        _enter(manager)
        try:
            yield
        finally:
            _exit(manager)


@torch.compiler.disable
def _enter(manager: contextlib.AbstractContextManager[None]) -> None:
    manager.__enter__()


@torch.compiler.disable
def _exit(manager: contextlib.AbstractContextManager[None]) -> None:
    manager.__exit__(None, None, None)


@functools.cache
def compile_step(mode: str | None = COMPILE_MODE, horizontal: bool = False) -> Callable[..., StepOutput]:
    """`train_step` through Inductor, one wrapper per mode (and `horizontal`: `HORIZONTAL_OPTIONS`):
    Dynamo's cache (per code object and wrapper) then serves every plan instance and variant compiled
    before, instead of recompiling."""
    if mode and horizontal:
        raise ValueError("torch.compile takes a mode or options, not both: horizontal fusion needs mode None")
    options: dict[str, Any] = {"mode": mode} if mode else {}
    if horizontal:
        options["options"] = dict(HORIZONTAL_OPTIONS)
    raise_dynamo_cache_limits()
    return torch.compile(train_step, dynamic=False, **options)  # type: ignore[return-value]


def raise_dynamo_cache_limits() -> None:
    """Every variant (StepFlags, precision, Hyper, replay sizes) is its own compiled entry by design; past
    Dynamo's default limit of 8 per function it would silently run the rest uncompiled."""
    dynamo_config = torch._dynamo.config
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 256)
    dynamo_config.accumulated_cache_size_limit = max(dynamo_config.accumulated_cache_size_limit, 1024)


class ReplayOps(NamedTuple):
    """The replay's work inside an update, through Inductor: sampling without its random numbers (PER's
    and HER's `torch.rand` stay eager: Dynamo does not trace a generator) and the priority write-back."""

    gather_into: Callable[..., None]  # ReplayBuffer.gather_into(replay, batch, points, her_draw, step)
    update_priorities: Callable[..., None]  # ReplayBuffer.update_priorities(replay, index, loss)


@functools.cache
def compile_replay_ops(horizontal: bool = False) -> ReplayOps:
    """`ReplayOps` compiled once per process and `horizontal` (`HORIZONTAL_OPTIONS`: the sampling's
    gathers of rows, windows and weights are independent); Dynamo guards on each replay it is given.

    Eager, they are ~50 small kernels per update (the search, gathers of rows and windows, weights, HER's
    relabelling, the write-back's casts and scatter); compiled, the tree descent's levels and the gathers
    fuse into a few.
    """
    raise_dynamo_cache_limits()
    options: dict[str, Any] = {"options": dict(HORIZONTAL_OPTIONS)} if horizontal else {}
    return ReplayOps(
        torch.compile(ReplayBuffer.gather_into, dynamic=False, **options),
        torch.compile(ReplayBuffer.update_priorities, dynamic=False, **options),
    )


class FusedPlan(DualStreamPlan):
    name = "fused"
    tf32 = True
    compiled = True
    """Run the step through Inductor (False: the dual plan's graph in TF32, for isolating tests)."""
    compile_mode: str | None = COMPILE_MODE
    sections: _EagerSections | None = None
    """The router's sections as Dynamo sees them, made on the first routed call."""

    def hyper(self, config: TrainConfig) -> Hyper:
        hp = super().hyper(config)
        from trainer.execution.kernels import window_attention  # Triton: what CUDA builds of torch bring

        model = config.model
        if self.compiled and window_attention.supports(model.attn_window, model.attn_dim // model.attn_heads):
            hp = dataclasses.replace(hp, attend=window_attention.window_attention_fused)
        kernel = config.run.c51_target_kernel  # 'triton' with too many atoms: the config refuses it
        if self.compiled and kernel != "inductor":
            from trainer.execution.kernels import c51

            if kernel == "triton" or c51.supports(model.atoms):
                hp = dataclasses.replace(hp, c51_target=c51.c51_target)
        if self.compiled and self.iqn_kernel_chosen(config, self.state.dims.branches * self.state.dims.actions):
            from trainer.execution.kernels import iqn

            hp = dataclasses.replace(hp, iqn_target=iqn.next_quantile_targets_fused)
        if self.compiled and config.run.iqn_online_kernel == "triton":
            from trainer.execution.kernels import iqn

            hp = dataclasses.replace(hp, iqn_online=iqn.quantiles_at_fused)
        if self.compiled and config.run.target_mlp_kernel == "triton":  # the data's actions: checked by the kernel
            from trainer.execution.kernels import mlp

            hp = dataclasses.replace(hp, target_networks=mlp.target_networks)
        return hp

    @staticmethod
    def iqn_kernel_chosen(config: TrainConfig, outputs: int) -> bool:
        """Whether the compiled step computes IQN's target quantiles with the Triton kernel: when asked ('triton'),
        or by 'auto' where it was measured faster (bf16; `docs/benchmarks/README.md`, issue 32 round 20) and the
        widths fit (`outputs`: the data's branches x actions)."""
        choice = config.run.iqn_target_kernel
        if choice != "auto":
            return choice == "triton"
        from trainer.execution.kernels import iqn

        model = config.model
        return config.run.precision == "bf16" and iqn.supports(model.iqn_embed, model.iqn_hidden, outputs)

    @functools.cached_property
    def step_fn(self) -> Callable[..., StepOutput]:
        """What `train` calls: the compiled step (one wrapper per mode, with `HORIZONTAL_OPTIONS` under
        `run.combo_kernels`), or the step itself."""
        return compile_step(self.compile_mode, self.config.run.combo_kernels) if self.compiled else train_step

    @property
    def replay_ops(self) -> ReplayOps:
        return compile_replay_ops(self.config.run.combo_kernels)

    def sample_batch(self, step: Tensor) -> None:
        if self.compiled:
            self.replay_ops.gather_into(self.replay, self.batch, *self.replay.draw(self.batch.size), step)
        else:
            super().sample_batch(step)

    def write_priorities(self, output: StepOutput) -> None:
        if self.compiled:
            self.replay_ops.update_priorities(self.replay, self.batch.index, output.priority)
        else:
            super().write_priorities(output)

    def train(self, flags: StepFlags, timer: SectionTimer) -> StepOutput:
        if isinstance(timer, StreamRouter):
            # One wrapper for every call: Dynamo guards on the objects it is given.
            if self.sections is None or self.sections.router is not timer:
                self.sections = _EagerSections(timer)
            timer = self.sections
        return self.step_fn(self.state, self.batch, self.draws, self.hp, flags, timer)
