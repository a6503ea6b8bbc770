"""The baseline plan: `train_step` as plain PyTorch, one kernel launch at a time.

Like most trainers it reads the losses back to the host every step, so each step ends in a sync.
Every component is timed by name (`StepTimer` sections), which is what the breakdown line prints.
Float32 unless `run.precision` says otherwise (tf32; bf16: autocast in the step, TF32 for the rest).
"""

from __future__ import annotations

import torch

from trainer.config import TrainConfig
from trainer.plans._capture import matmul_precision, uses_tf32
from trainer.replay.buffer import ReplayBuffer
from trainer.state import TrainState
from trainer.step import Draws, Hyper, SectionTimer, StepFlags, StepOutput, train_step


class EagerPlan:
    name = "eager"
    steps_per_call = 1
    read_losses = True
    """Read the losses back to the host every step (a sync), as trainers do."""

    def __init__(
        self,
        state: TrainState,
        replay: ReplayBuffer,
        config: TrainConfig,
        timer: SectionTimer,
        generator: torch.Generator,
    ) -> None:
        self.state, self.replay, self.config, self.timer, self.generator = state, replay, config, timer, generator
        self.hp = Hyper.from_config(config)
        self.batch = replay.empty_batch(config.run.batch_size)  # refilled in place each step
        self.draws = Draws.empty(state.dims, config.run.batch_size, state.atoms.device, permute=config.loss.causal)
        self.tf32 = uses_tf32(config.run.precision, plan_default=False)
        self.last_losses: dict[str, float] = {}

    def run(self, step: int) -> StepOutput:
        with self.timer.section("sample"):
            self.replay.sample_into(self.batch, step)
            self.draws.fill_(self.generator)
        with matmul_precision(self.tf32):
            output = self.train(StepFlags.for_step(step, self.config))
        with self.timer.section("priority"):
            self.replay.update_priorities(self.batch.index, output.priority)
        if self.read_losses:
            self.last_losses = {name: float(value) for name, value in output.losses.items()}
        return output

    def train(self, flags: StepFlags) -> StepOutput:
        """The update over this step's batch and draws, its parts timed by name."""
        return train_step(self.state, self.batch, self.draws, self.hp, flags, self.timer)
