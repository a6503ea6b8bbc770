"""What every execution plan offers the training loop and the benchmark, and what each one holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from contracts.plans import PLANS
from trainer.algo.step import Draws, Hyper, StepOutput
from trainer.execution.plans._capture import require_cuda, uses_tf32

if TYPE_CHECKING:
    import torch

    from contracts.config import TrainConfig
    from trainer.algo.replay.buffer import ReplayBuffer
    from trainer.algo.state import TrainState
    from trainer.algo.step import SectionTimer


class Plan(Protocol):
    """Runs `train_step` some way. `run(step)` samples, updates and writes priorities back for
    `steps_per_call` consecutive steps starting at global step `step`, returning the last output."""

    name: str
    steps_per_call: int

    def run(self, step: int) -> StepOutput: ...


class BasePlan:
    """The setup every plan shares: its inputs, the step's constants (`hp`), the static batch and draws
    that sampling refills in place, and the matrix-product precision it runs at.

    Subclasses set `name`, may set `tf32` (their own precision under `run.precision=auto`), and add
    their own buffers, streams and graphs in `build`, which the constructor calls last. A plan the
    registry says needs CUDA refuses any other device before it allocates anything.
    """

    name: str
    steps_per_call = 1
    tf32 = False
    """The plan's default: TF32 matrix products (`uses_tf32` turns it into the instance's setting)."""

    def __init__(
        self,
        state: TrainState,
        replay: ReplayBuffer,
        config: TrainConfig,
        timer: SectionTimer,
        generator: torch.Generator,
    ) -> None:
        if PLANS[self.name].needs_cuda:  # type: ignore[index]
            require_cuda(self.name, state.atoms.device)
        self.state, self.replay, self.config, self.timer, self.generator = state, replay, config, timer, generator
        self.device = state.atoms.device
        self.tf32 = uses_tf32(config.run.precision, type(self).tf32)
        self.hp = self.hyper(config)
        self.batch = replay.empty_batch(config.run.batch_size)  # refilled in place each step
        self.draws = Draws.empty(state.dims, config.run.batch_size, self.device, permute=config.loss.causal)
        self.last_losses: dict[str, float] = {}
        self.build()

    def build(self) -> None:
        """A plan's own buffers, streams and graphs, once the shared ones exist (none for eager)."""

    def hyper(self, config: TrainConfig) -> Hyper:
        """The step's constants (the fused plans also pick their kernels here)."""
        return Hyper.from_config(config)

    def sample(self, step: int) -> None:
        """Step `step`'s batch and draws into the static buffers, on the host's side of the plan."""
        with self.timer.section("sample"):
            self.replay.sample_into(self.batch, step)
            self.draws.fill_(self.generator)
