"""Which runs may share one pack (issue 31), torch-free: the search's suggest step groups trials with it
without importing the trainer's execution (torch), and the pack itself refuses configs it cannot run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contracts.config import TrainConfig

MAX_PACK = 64
"""The most runs one pack holds (the metrics' `run` label stays bounded)."""

PACKABLE: frozenset[str] = frozenset(
    {
        "run.seed",
        "loss.gamma",
        "loss.reward_scale",
        "loss.cql_alpha",
        "loss.ensemble_diversity",
        "loss.vaccine_epsilon",
        "loss.vaccine_weight",
        "optim.lr",
        "optim.aux_lr",
        "optim.beta1",
        "optim.beta2",
        "optim.eps",
        "optim.max_grad_norm",
        "optim.budget_c51",
        "optim.budget_cql",
        "optim.budget_iqn",
        "optim.budget_ensemble",
        "optim.target_tau",
        "optim.sigma_max",
        "replay.alpha",
        "replay.beta_start",
        "replay.beta_end",
        "data.epsilon_start",
        "data.epsilon_end",
    }
)
"""Config fields (dotted) that may differ between the runs of a pack: the seed and the numbers the step,
the replay's sampler and exploration read as values. Everything else (shapes, switches, schedules, the
checked IQN κ and IQL expectile) must be equal: it changes what the step is."""


def unpackable(searched: Iterable[str]) -> list[str]:
    """The searched fields a pack's runs cannot vary (not in PACKABLE): trials that drew different values of
    them train in different packs."""
    return sorted(name for name in searched if name not in PACKABLE)


def packing_note(searched: Iterable[str]) -> str | None:
    """What a search of these fields means for its packs, for the job's message; None when every trial may pack."""
    fixed = unpackable(searched)
    if not fixed:
        return None
    return (
        f"the search space varies {', '.join(fixed)}, which the runs of a pack cannot vary (it changes the model's "
        "shapes or the step): trials pack only with those that drew the same values, the others run one pack "
        "(for a continuous field, one trial) per pod"
    )


class PackError(ValueError):
    """These configs cannot run as one pack (the message names the first field that differs)."""


def dotted(config: TrainConfig) -> dict[str, Any]:
    """Every field of `config` by its dotted name ("optim.lr")."""
    return {
        f"{section}.{name}": value for section, fields in config.model_dump().items() for name, value in fields.items()
    }


def check_packable(configs: Sequence[TrainConfig]) -> list[str]:
    """The dotted fields that differ between `configs`, all in `PACKABLE`; else `PackError`."""
    if not 1 <= len(configs) <= MAX_PACK:
        raise PackError(f"a pack holds 1 to {MAX_PACK} runs, got {len(configs)}")
    first = dotted(configs[0])
    differing: list[str] = []
    for config in configs[1:]:
        for name, value in dotted(config).items():
            if value != first[name] and name not in differing:
                if name not in PACKABLE:
                    raise PackError(
                        f"runs of one pack must share {name} ({first[name]!r} and {value!r}): only the seed and "
                        f"numeric hyper-parameters may differ ({', '.join(sorted(PACKABLE))})"
                    )
                differing.append(name)
    return sorted(differing)
