"""A hyper-parameter search's space as data, torch- and Optuna-free: the controller validates a job's space
(`TrainConfig.search.space`) with it, and the trainer's search (`trainer/tools/hyperopt.py`) samples it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

Choice = None | bool | int | float | str

MAX_DIMENSIONS = 64
"""The most fields one space searches (a job's config is bounded like the rest of its request)."""

DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "optim.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
    "loss.cql_alpha": {"type": "float", "low": 0.0, "high": 1.0},
    "optim.target_tau": {"type": "float", "low": 1e-3, "high": 5e-2, "log": True},
    "replay.alpha": {"type": "float", "low": 0.3, "high": 0.9},
}
"""The space searched when neither the config (`search.space`) nor `--space` names one: dotted TrainConfig field
-> its dimension. Numeric hyper-parameters only, so the trials of a search all pack (contracts/packs.py)."""


class SearchDimension(BaseModel):
    """One dimension of the space; `log` samples uniformly in log space, `step` discretises."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Choice] | None = None

    @model_validator(mode="after")
    def _shape(self) -> SearchDimension:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("categorical needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("categorical takes only 'choices'")
            return self
        if self.choices is not None:
            raise ValueError(f"{self.type} takes low/high, not 'choices'")
        if self.low is None or self.high is None:
            raise ValueError(f"{self.type} needs 'low' and 'high'")
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError(f"log sampling needs low > 0, got {self.low}")
        if self.step is not None and self.step <= 0:
            raise ValueError(f"step must be > 0, got {self.step}")
        if self.log and self.step is not None:
            raise ValueError("log and step do not go together (log sampling is continuous)")
        if self.type == "int" and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError(f"int needs whole low/high, got {self.low}..{self.high}")
        return self

    def corners(self) -> list[Choice]:
        """The values that bound what a trial may draw: every choice, or low and high."""
        if self.type == "categorical":
            return list(self.choices or [])
        assert self.low is not None and self.high is not None
        if self.type == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]
