"""Phase 1: the whole update in ONE CUDA graph per periodic variant.

Spectral norm, forward, CQL, budget clipping, pruning, Adam, IQL, attention, the guard, the target
EMA and the priority write-back are captured from `train_step` over static buffers (a static Batch
and static Draws), so a step is: sample into the static batch, fill the draws, replay one graph.
No host sync anywhere: Adam's bias correction reads `state.updates` on the device, the guard skips
with `torch.where`. Vaccine (every 10th step) and causal (every 100th) are separate captured
variants, picked on the host from the step number (`StepFlags.for_step`).
"""

from __future__ import annotations

import functools

import torch

from trainer.batch import Batch
from trainer.config import TrainConfig
from trainer.plans._capture import (
    Snapshot,
    StreamRouter,
    capture,
    flag_variants,
    matmul_precision,
    require_cuda,
    unique_generators,
)
from trainer.replay.buffer import ReplayBuffer
from trainer.state import TrainState
from trainer.step import NO_TIMER, Draws, Hyper, SectionTimer, StepFlags, StepOutput, train_step


class GraphPlan:
    """Sampling stays eager (outside the graph); the rest of the step is one graph replay."""

    name = "graph"
    steps_per_call = 1
    tf32 = False
    """Capture with TF32 matrix products (the fused plans)."""
    streams = False
    """Run attention, IQL and the EMA on side streams inside the graph (the dual plan and later)."""

    def __init__(
        self,
        state: TrainState,
        replay: ReplayBuffer,
        config: TrainConfig,
        timer: SectionTimer,
        generator: torch.Generator,
    ) -> None:
        self.device = state.atoms.device
        require_cuda(self.name, self.device)
        self.state, self.replay, self.config, self.timer, self.generator = state, replay, config, timer, generator
        self.hp = self.hyper(config)
        self.batch = replay.empty_batch(config.run.batch_size)
        self.draws = Draws.empty(state.dims, config.run.batch_size, self.device)
        # Valid values for the warm-up before the first real fill (empty memory may hold any index).
        self.draws.tau.fill_(0.5)
        self.draws.tau_target.fill_(0.5)
        self.draws.perm.copy_(torch.arange(config.run.batch_size, device=self.device))
        self.router = StreamRouter(self.device) if self.streams else None
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_stream = torch.cuda.Stream(self.device)
        self.graphs: dict[object, tuple[torch.cuda.CUDAGraph, StepOutput]] = {}
        self.last_losses: dict[str, float] = {}
        self.prepare()

    # ---- what one captured graph runs -------------------------------------------------------

    def hyper(self, config: TrainConfig) -> Hyper:
        """The step's constants (the fused plan also picks its kernels here)."""
        return Hyper.from_config(config)

    def train(self, flags: StepFlags, timer: SectionTimer) -> StepOutput:
        """The maths of one update over the static buffers (the fused plan swaps in its compiled form)."""
        return train_step(self.state, self.batch, self.draws, self.hp, flags, timer)

    def update_body(self, flags: StepFlags) -> StepOutput:
        """One update and its priority write-back, streams forked and joined inside."""
        timer: SectionTimer = NO_TIMER
        if self.router is not None:
            self.router.begin()
            timer = self.router
        output = self.train(flags, timer)
        self.replay.update_priorities(self.batch.index, output.priority)
        if self.router is not None:
            self.router.join()
        return output

    def variants(self) -> list[object]:
        """Keys of the graphs to capture: one per StepFlags the schedule can produce."""
        return list(flag_variants(self.config))

    def body(self, key: object) -> StepOutput:
        assert isinstance(key, StepFlags)
        return self.update_body(key)

    def generators(self) -> list[torch.Generator]:
        """Generators the captured body draws from (none: sampling and draws run outside the graph)."""
        return []

    # ---- capture and replay -----------------------------------------------------------------

    def prepare(self) -> None:
        """Capture every variant the schedule can produce, before the first step is timed."""
        self.capture_keys(self.variants())

    def capture_keys(self, keys: list[object]) -> None:
        """Capture `keys`; the warm-up's writes to state, priorities and generators are undone."""
        generators = unique_generators(*self.generators()) if self.generators() else []
        snapshot = Snapshot(self.state, self.replay, unique_generators(self.generator, *generators))
        with matmul_precision(self.tf32):
            for key in keys:
                body = functools.partial(self.body, key)
                self.graphs[key] = capture(body, self.pool, self.capture_stream, generators)
        snapshot.restore()
        torch.cuda.synchronize(self.device)

    def graph_for(self, key: object) -> tuple[torch.cuda.CUDAGraph, StepOutput]:
        """The graph of `key`, captured now if the schedule reached a variant not captured up front."""
        if key not in self.graphs:
            self.capture_keys([key])
        return self.graphs[key]

    def run(self, step: int) -> StepOutput:
        with self.timer.section("sample"):
            self.replay.sample_into(self.batch, step)
            self.draws.fill_(self.generator)
        graph, output = self.graph_for(StepFlags.for_step(step, self.config))
        with self.timer.section("graph"):
            graph.replay()
        return output

    def update(self, batch: Batch, draws: Draws, step: int) -> StepOutput:
        """Replay step `step`'s update graph on a given batch and draws (equivalence tests feed eager's)."""
        self.batch.copy_(batch)
        for name in ("tau", "tau_target", "perm"):
            getattr(self.draws, name).copy_(getattr(draws, name))
        graph, output = self.graph_for(StepFlags.for_step(step, self.config))
        graph.replay()
        return output
