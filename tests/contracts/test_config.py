import json
from pathlib import Path

import pytest

from contracts.config import (
    INT32_MAX,
    STEPS_PER_EPOCH,
    ConfigError,
    TrainConfig,
    apply_epochs,
    build_config,
    check_model,
    load_config,
    parse_overrides,
)


def test_defaults_are_the_pinned_model() -> None:
    config = TrainConfig()
    assert (config.model.hidden, config.model.atoms, config.run.batch_size) == (256, 51, 1024)
    assert (config.model.v_min, config.model.v_max, config.loss.gamma) == (-10.0, 10.0, 0.99)
    assert config.replay.capacity == 1_000_000
    assert (config.run.eval_every, config.run.eval_select_episodes) == (0, 5)  # best-policy selection off


def test_yaml_and_json_load_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.001\nrun:\n  steps: 10\n")
    config = load_config(path, ["run.steps=20", "loss.cql=false"])
    assert config.optim.lr == 0.001 and config.run.steps == 20 and config.loss.cql is False
    json_path = tmp_path / "c.json"
    json_path.write_text(json.dumps(config.model_dump(mode="json")))
    assert load_config(json_path) == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lr=-1"], "optim.lr: Input should be greater than 0 (got -1)"),
        (["model.hidden=big"], "model.hidden: Input should be a valid integer"),
        (["run.plan=turbo"], "run.plan: Input should be"),
        (["model.nope=1"], "model.nope: Extra inputs are not permitted"),
        (["model.v_min=5", "model.v_max=1"], "v_max (1.0) must be greater than v_min (5.0)"),
        (["optim.budget_c51=0.9"], "gradient budgets sum to 1.300"),
        (["run.batch_size=100", "replay.capacity=50"], "run.batch_size (100) exceeds replay.capacity (50)"),
        (["run.eval_every=-1"], "run.eval_every: Input should be greater than or equal to 0 (got -1)"),
        (["run.eval_select_episodes=0"], "run.eval_select_episodes: Input should be greater than or equal to 1"),
        (["run.eval_select_episodes=20000"], "run.eval_select_episodes: Input should be less than or equal to 10000"),
        (["data.source=offline"], "data.dataset is required"),
        (["lr"], "expected key=value"),
    ],
)
def test_validation_errors_name_the_field_and_value(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({}, overrides)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML/JSON"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(scalar)


def test_override_values_parse_as_yaml_scalars() -> None:
    assert parse_overrides(["a.b=3", "a.c=true", "d=1e-3", "e=text"]) == {
        "a": {"b": 3, "c": True},
        "d": 1e-3,
        "e": "text",
    }


# ---- a job's model and epochs ---------------------------------------------------------------------
def test_epochs_become_exactly_epochs_times_steps_per_epoch() -> None:
    config = build_config({"run": {"seed": 3}})
    resolved = apply_epochs(config, 7)
    assert resolved.run.steps == 7 * STEPS_PER_EPOCH and resolved.run.seed == 3
    assert config.run.steps == 2000 and "steps" not in config.run.model_fields_set  # the input is left alone
    assert apply_epochs(config, None) is config


@pytest.mark.parametrize("source", [{"run": {"steps": 2000}}, {"run": {"steps": 5}}])
def test_a_config_that_sets_run_steps_takes_no_epochs(source: dict[str, object]) -> None:
    """Refused even when the two agree: a job gives its length once, nothing is reconciled."""
    with pytest.raises(ConfigError, match=r"the config sets run.steps \(\d+\) and the job asks for 1 epochs"):
        apply_epochs(build_config(source), 1)
    with pytest.raises(ConfigError, match="run.steps"):
        apply_epochs(build_config({}, ["run.steps=5"]), 1)


@pytest.mark.parametrize("epochs", [0, -1, INT32_MAX // STEPS_PER_EPOCH + 1])
def test_epochs_beyond_what_run_steps_holds_are_refused(epochs: int) -> None:
    with pytest.raises(ConfigError, match="epochs must be between 1 and"):
        apply_epochs(TrainConfig(), epochs)


def test_dqn_is_the_one_model() -> None:
    check_model("dqn")
    with pytest.raises(ConfigError, match=r"^model 'c51' is not one this trainer trains; models: dqn$"):
        check_model("c51")
