"""A search space as a job's config carries it (`search.space`): checked torch- and Optuna-free, as the
controller checks a job at submission."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from contracts.config import ConfigError, TrainConfig, build_config, check_search
from contracts.search import DEFAULT_SPACE, SearchDimension

HIDDEN = {"model.hidden": {"type": "categorical", "choices": [16, 32]}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "float", "low": 0.1, "high": 0.01}, "low (0.1) must not exceed high (0.01)"),
        ({"type": "float", "low": 0.0, "high": 0.1, "log": True}, "log sampling needs low > 0"),
        ({"type": "float", "low": 0.0, "high": 0.1, "step": 0}, "step must be > 0"),
        ({"type": "float", "low": 0.1, "high": 1.0, "log": True, "step": 0.1}, "log and step do not go together"),
        ({"type": "int", "low": 8.5, "high": 64}, "int needs whole low/high"),
        ({"type": "float", "low": 0.0, "high": float("inf")}, "finite number"),
        ({"type": "categorical", "choices": []}, "non-empty 'choices'"),
        ({"type": "float", "low": 0.1}, "float needs 'low' and 'high'"),
    ],
)
def test_a_malformed_dimension_is_refused_with_its_reason(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        SearchDimension.model_validate(spec)


def test_corners_are_the_bounds_or_every_choice() -> None:
    assert SearchDimension(type="int", low=16, high=64, step=16).corners() == [16, 64]
    assert SearchDimension(type="float", low=1e-5, high=1e-3, log=True).corners() == [1e-5, 1e-3]
    assert SearchDimension(type="categorical", choices=["graph", None]).corners() == ["graph", None]


def test_the_config_names_only_fields_of_its_sections() -> None:
    config = build_config({"search": {"space": {**DEFAULT_SPACE, **HIDDEN}}})
    assert config.search.space is not None and config.search.space["model.hidden"].choices == [16, 32]
    assert TrainConfig().search.space is None  # the default space
    for name in ("optim.nope", "nope.lr", "optim", "optim.lr.x", "search.space"):
        with pytest.raises(ConfigError, match=f"search.space: '{name}' is not a config field to search"):
            build_config({"search": {"space": {name: {"type": "float", "low": 0.1, "high": 0.2}}}})


def test_a_search_is_checked_before_any_trial() -> None:
    check_search(TrainConfig(), 0)
    check_search(build_config({"search": {"space": HIDDEN}}), 4)
    with pytest.raises(ConfigError, match=r"^search.space is the space of a hyper-parameter search: the job asks"):
        check_search(build_config({"search": {"space": HIDDEN}}), 0)
    with pytest.raises(ConfigError, match=r"^run.eval_episodes is 0: the search needs >= 1 for its objective$"):
        check_search(build_config({"run": {"eval_episodes": 0}}), 2)
    bad_bound = {"replay.alpha": {"type": "float", "low": 0.5, "high": 2.0}}
    with pytest.raises(ConfigError, match=r"^space replay.alpha: 2.0 does not make a valid config: replay.alpha: "):
        check_search(build_config({"search": {"space": bad_bound}}), 2)
    with pytest.raises(ConfigError, match=r"^space run.plan: 'turbo' does not make a valid config"):
        check_search(TrainConfig(), 2, {"run.plan": ["graph", "turbo"]})
