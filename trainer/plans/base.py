"""What every execution plan offers the training loop and the benchmark."""

from __future__ import annotations

from typing import Protocol

from trainer.step import StepOutput


class Plan(Protocol):
    """Runs `train_step` some way. `run(step)` samples, updates and writes priorities back for
    `steps_per_call` consecutive steps starting at global step `step`, returning the last output."""

    name: str
    steps_per_call: int

    def run(self, step: int) -> StepOutput: ...
