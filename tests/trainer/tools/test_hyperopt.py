"""The Optuna search on CPU with a tiny budget: whole local search, fan-out with a crash, bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from contracts.config import ConfigError, TrainConfig, build_config, load_config
from tests.import_guard import trainer_cli_without
from trainer.cli import app
from trainer.tools.hyperopt import (
    DEFAULT_SPACE,
    HyperoptError,
    TrialFailed,
    check_space,
    load_space,
    objective_of,
    open_study,
    parse_space,
    plan_packs,
    suggest,
    trial_config,
)

TINY = {
    "model": {
        "hidden": 16, "head_hidden": 16, "atoms": 11, "iqn_embed": 8, "iqn_hidden": 16, "iqn_taus": 4,
        "iqn_target_taus": 4, "iql_hidden": 8, "attn_window": 4, "attn_dim": 8, "attn_heads": 2, "attn_ffn": 16,
    },
    "loss": {"attention": False, "iql": False},
    "replay": {"capacity": 256},
    "run": {"steps": 10, "batch_size": 16, "device": "cpu", "eval_episodes": 1, "log_every": 5,
            "checkpoint_every": 1000},
    "data": {"source": "market", "learning_starts": 32, "market_features": 16, "market_horizon": 16},
}  # fmt: skip


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


@pytest.fixture(autouse=True)
def _own_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trials checkpoint in their run directories, whatever the calling shell exports."""
    monkeypatch.delenv("FOXHUNT_CHECKPOINT_URL", raising=False)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["hyperopt", *args])
    return result.exit_code, result.stdout, result.stderr


def states(storage: str, name: str) -> dict[int, TrialState]:
    return {t.number: t.state for t in optuna.load_study(study_name=name, storage=storage).get_trials()}


@pytest.mark.filterwarnings("ignore:Fixed parameter optim.lr:UserWarning")
def test_run_searches_then_trains_the_best_config_in_full(config_file: Path, storage: str, tmp_path: Path) -> None:
    out = tmp_path / "search"
    optuna.create_study(study_name="local", storage=storage, direction="maximize").enqueue_trial({"optim.lr": 2.0})
    args = ["run", "--config", str(config_file), "--trials", "3", "--storage", storage, "--study", "local"]
    code, stdout, stderr = invoke(*args, "--run-dir", str(out), "--trial-steps", "5")

    assert code == 0, stderr
    # The enqueued trial 0 cannot make a valid config: recorded FAIL, and the search went on.
    assert states(storage, "local") == {0: TrialState.FAIL, 1: TrialState.COMPLETE, 2: TrialState.COMPLETE}
    assert "trial 0: its config is invalid: optim.lr" in stdout
    best = json.loads((out / "best.json").read_text())
    assert best["trial"] in (1, 2)
    config = TrainConfig.model_validate(best["config"])
    assert config == load_config(out / "best-config.json")
    assert config.optim.lr == pytest.approx(best["params"]["optim.lr"])
    assert config.replay.alpha == pytest.approx(best["params"]["replay.alpha"])
    assert config.run.steps == 10  # --trial-steps shortens trials only
    assert json.loads((out / f"trial-{best['trial']}" / "summary.json").read_text())["step"] == 5
    final = json.loads((out / "final" / "summary.json").read_text())
    assert final["step"] == 10 and best["eval_return_mean"] == final["eval_return_mean"]


def test_run_with_a_pack_size_trains_its_trials_as_one_pack(config_file: Path, storage: str, tmp_path: Path) -> None:
    """`hyperopt run --pack-size 2`: the two trials (the default space: numeric fields only) are asked together
    and trained as one pack, each in its own folder, then the best is trained in full as before."""
    out = tmp_path / "search"
    args = ["run", "--config", str(config_file), "--trials", "2", "--storage", storage, "--study", "packed"]
    code, stdout, stderr = invoke(*args, "--run-dir", str(out), "--trial-steps", "5", "--pack-size", "2")

    assert code == 0, stderr
    assert states(storage, "packed") == {0: TrialState.COMPLETE, 1: TrialState.COMPLETE}
    assert "packs: 2 trials in 1 pod(s): 0,1" in stdout
    for number in (0, 1):
        summary = json.loads((out / f"trial-{number}" / "summary.json").read_text())
        assert summary["packed"] is True and summary["step"] == 5
    assert json.loads((out / "final" / "summary.json").read_text())["step"] == 10


def test_suggest_trial_best_with_a_crashing_trial(config_file: Path, storage: str, tmp_path: Path) -> None:
    study = ["--storage", storage, "--study", "fan"]
    suggest = ["suggest", "--config", str(config_file), "--trials", "3", *study, "--pack-size", "1"]
    code, stdout, stderr = invoke(*suggest)
    assert code == 0, stderr
    assert json.loads(stdout) == ["0", "1", "2"]  # packs of one trial: each trains alone, as before packs
    assert invoke(*suggest)[1] == stdout  # a retried suggest asks nothing new
    assert len(states(storage, "fan")) == 3

    # Trial 1 trains on a config whose dataset is missing: the trainer raises, the study records FAIL.
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({**TINY, "data": {"source": "offline", "dataset": str(tmp_path / "no.npz")}}))
    code, _, stderr = invoke("trial", "--trials", "1", "--config", str(broken), *study, "--run-dir", str(tmp_path))
    assert code == 1
    assert stderr.startswith("error: trial 1 failed: DatasetError") and stderr.count("\n") == 1
    for number in (0, 2):
        code, stdout, stderr = invoke("trial", "--trials", str(number), "--config", str(config_file), *study,
                                      "--run-dir", str(tmp_path), "--trial-steps", "5")  # fmt: skip
        assert code == 0, stderr
        assert f"trial {number}: eval_return_mean=" in stdout
    assert states(storage, "fan") == {0: TrialState.COMPLETE, 1: TrialState.FAIL, 2: TrialState.COMPLETE}

    assert (tmp_path / "trial-2" / "summary.json").is_file()
    code, stdout, _ = invoke("trial", "--trials", "0", "--config", str(config_file), *study)
    assert code == 0 and "already complete" in stdout  # a re-run step does not train again
    code, _, stderr = invoke("trial", "--trials", "1", "--config", str(config_file), *study)
    assert code == 2 and "trial 1 is FAIL, not RUNNING" in stderr
    assert invoke(*suggest)[1].strip() == "[]"  # nothing left to run

    out = tmp_path / "best-config.json"
    code, _, stderr = invoke("best", *study, "--config", str(config_file), "--out", str(out))
    assert code == 0, stderr
    done = optuna.load_study(study_name="fan", storage=storage).get_trials(states=(TrialState.COMPLETE,))
    winner = max(done, key=lambda t: t.value or -math.inf)
    assert load_config(out) == trial_config(load_config(config_file), winner.params)


def test_bad_input_exits_2_with_one_line_from_the_real_process(tmp_path: Path, storage: str) -> None:
    missing = tmp_path / "missing.yaml"
    args = ["suggest", "--config", str(missing), "--trials", "2", "--storage", storage, "--study", "s"]
    done = subprocess.run([sys.executable, "-m", "trainer", "hyperopt", *args], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == f"error: config file not found: {missing}\n" and done.stdout == ""


@pytest.mark.parametrize("command", ["trial --trials 0", "best --out best.json"])
def test_unknown_study_exits_2(command: str, config_file: Path, storage: str) -> None:
    code, _, stderr = invoke(*command.split(), "--storage", storage, "--study", "nope", "--config", str(config_file))
    assert code == 2 and stderr == f"error: study 'nope' not found in {storage}\n"


def test_unknown_trial_and_unreachable_storage_exit_2(config_file: Path, storage: str, tmp_path: Path) -> None:
    open_study(storage, "s", create=True)
    code, _, stderr = invoke(
        "trial", "--trials", "7", "--storage", storage, "--study", "s", "--config", str(config_file)
    )
    assert code == 2 and "has no trial 7" in stderr
    nowhere = f"sqlite:///{tmp_path / 'no' / 'dir' / 'o.db'}"
    code, _, stderr = invoke("suggest", "--trials", "1", "--storage", nowhere, "--study", "s")
    assert code == 2 and stderr.startswith(f"error: storage {nowhere}:") and stderr.count("\n") == 1


def test_storage_errors_do_not_print_the_password() -> None:
    with pytest.raises(HyperoptError, match=r"^storage postgresql://optuna:\*\*\*@127.0.0.1:1/db: ") as caught:
        open_study("postgresql://optuna:s3cret@127.0.0.1:1/db", "s", create=True)
    assert "s3cret" not in str(caught.value)


def test_best_without_a_completed_trial_exits_1(config_file: Path, storage: str, tmp_path: Path) -> None:
    study = open_study(storage, "s", create=True)
    study.tell(study.ask(parse_space(DEFAULT_SPACE)), state=TrialState.FAIL)
    code, _, stderr = invoke("best", "--storage", storage, "--study", "s", "--out", str(tmp_path / "b.json"))
    assert code == 1 and stderr == "error: study 's' has no completed trial (1 failed)\n"


def test_bad_space_file_exits_2_before_any_trial(config_file: Path, storage: str, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"replay.alpha": {"type": "float", "low": 0.5, "high": 2.0}}))
    code, _, stderr = invoke("suggest", "--trials", "2", "--storage", storage, "--study", "s", "--space", str(space))
    assert code == 2 and stderr.startswith("error: space replay.alpha: 2.0 does not make a valid config")
    assert stderr.count("\n") == 1
    assert not (tmp_path / "optuna.db").exists()  # checked before the storage is touched
    code, _, stderr = invoke("suggest", "--trials", "2", "--storage", storage, "--study", "s", "--space", "nope.yaml")
    assert code == 2 and stderr == "error: space file not found: nope.yaml\n"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"optim.lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}, "space optim.lr: "),
        ({"optim.lr": {"type": "float", "low": 0.1, "high": 0.01}}, "space optim.lr: "),
        ({"optim.lr": {"type": "float", "low": 0.1}}, "float needs 'low' and 'high'"),
        ({"optim.lr": {"type": "normal", "low": 0.1, "high": 1}}, "space optim.lr: type:"),
        ({"model.hidden": {"type": "int", "low": 8.5, "high": 64}}, "int needs whole low/high"),
        ({"run.plan": {"type": "categorical", "choices": []}}, "non-empty 'choices'"),
        ({"run.plan": {"type": "categorical", "choices": ["eager"], "low": 1}}, "categorical takes only"),
        ({"optim.lr": {"type": "float", "low": 0.1, "high": 0.2, "choices": [1]}}, "takes low/high, not 'choices'"),
        ([1, 2], "expected a non-empty mapping"),
    ],
)
def test_parse_space_rejects_malformed_specs(spec: object, message: str) -> None:
    with pytest.raises(HyperoptError, match=r"^[^\n]*$") as caught:
        parse_space(spec)
    assert message in str(caught.value)


def test_check_space_validates_every_bound_and_choice_through_the_config() -> None:
    base = build_config(TINY)
    check_space(parse_space(DEFAULT_SPACE), base)
    with pytest.raises(HyperoptError, match=r"space optim\.nope: 0\.1 does not make a valid config"):
        check_space(parse_space({"optim.nope": {"type": "float", "low": 0.1, "high": 0.2}}), base)
    with pytest.raises(HyperoptError, match=r"space run\.plan: 'turbo'"):
        check_space(parse_space({"run.plan": {"type": "categorical", "choices": ["graph", "turbo"]}}), base)
    with pytest.raises(HyperoptError, match=r"run\.eval_episodes is 0"):
        check_space(parse_space(DEFAULT_SPACE), build_config(TINY, ["run.eval_episodes=0"]))


def test_parameters_apply_with_their_exact_values() -> None:
    params = {"optim.lr": 1e-05, "run.plan": "graph", "loss.cql": False, "model.hidden": 32, "data.dataset": "1.5"}
    config = trial_config(build_config(TINY), params, ["run.steps=5"])
    assert config.optim.lr == 1e-05 and config.run.plan == "graph" and config.loss.cql is False
    assert config.model.hidden == 32 and config.data.dataset == "1.5" and config.run.steps == 5
    with pytest.raises(ConfigError, match=r"^run\.steps\.x: steps is not a section$"):
        trial_config(build_config(TINY), {"run.steps.x": 1})


@pytest.mark.parametrize(
    ("summary", "message"),
    [({"eval_return_mean": None}, "no eval_return_mean"), ({"eval_return_mean": math.nan}, "is nan"),
     ({"eval_return_mean": -math.inf}, "is -inf")],
)  # fmt: skip
def test_a_missing_or_non_finite_objective_fails_the_trial(summary: dict[str, float | None], message: str) -> None:
    assert objective_of({"eval_return_mean": -1.5}) == -1.5
    with pytest.raises(TrialFailed, match=message):
        objective_of(summary)


# ---- packs: trials trained K at a time in one process (issue 31) ------------------------------------
def asked(storage: str, params: list[dict[str, float]], space: dict[str, object]) -> tuple[optuna.Study, list[int]]:
    """A study whose trials drew `params` (enqueued, then asked as suggest asks them)."""
    study = open_study(storage, "packs", create=True)
    for values in params:
        study.enqueue_trial(values)
        study.ask(parse_space(space))  # the enqueued values, as suggest's ask takes them
    numbers = suggest(study, parse_space(space), len(params), lambda line: None)
    return study, numbers


def test_suggest_packs_trials_that_differ_in_packable_fields_only(storage: str) -> None:
    params = [{"optim.lr": 1e-4 * (n + 1), "replay.alpha": 0.5} for n in range(5)]
    study, numbers = asked(storage, params, DEFAULT_SPACE)
    lines: list[str] = []
    packs = plan_packs(study, numbers, parse_space(DEFAULT_SPACE), TrainConfig(), 2, lines.append)
    assert packs == [[0, 1], [2, 3], [4]]
    assert lines == ["packs: 5 trials in 3 pod(s): 0,1 2,3 4"]  # every searched field packs: nothing said
    assert plan_packs(study, numbers, parse_space(DEFAULT_SPACE), TrainConfig(), 16, lines.append) == [numbers]


def test_a_searched_shape_packs_only_trials_that_drew_the_same_shape_and_says_so(storage: str) -> None:
    space = {**DEFAULT_SPACE, "model.hidden": {"type": "int", "low": 16, "high": 64, "step": 16}}
    hidden = [16, 32, 16, 48, 16]
    study, numbers = asked(storage, [{"model.hidden": h, "optim.lr": 1e-4} for h in hidden], space)
    lines: list[str] = []
    packs = plan_packs(study, numbers, parse_space(space), TrainConfig(), 16, lines.append)
    assert packs == [[0, 2, 4], [1], [3]]  # model.hidden changes the network's shapes: a pack shares it
    assert "the space searches model.hidden, which a pack's runs cannot vary" in lines[0]
    assert "2 of 5 trials run one per pod" in lines[0]
    code, stdout, stderr = invoke("suggest", "--trials", "5", "--storage", storage, "--study", "packs",
                                  "--space", str(_space_file(space, storage)))  # fmt: skip
    assert (code, json.loads(stdout)) == (0, ["0,2,4", "1", "3"]) and "cannot vary" in stderr


def test_suggest_groups_its_packs_without_importing_torch(config_file: Path, storage: str) -> None:
    """suggest runs in a small CPU pod whose image makes the root filesystem read-only: importing torch's
    compiler there fails on its cache folder (seen in CI), and it would cost seconds for nothing."""
    script = trainer_cli_without("torch", "torch imported by hyperopt suggest")
    args = ["hyperopt", "suggest", "--config", str(config_file), "--trials", "3", "--storage", storage]
    result = subprocess.run([sys.executable, "-c", script, *args, "--study", "no-torch"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == ["0,1,2"]  # the default space packs: one pod for all three


def _space_file(space: dict[str, object], storage: str) -> Path:
    path = Path(storage.removeprefix("sqlite:///")).with_name("space.yaml")
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.filterwarnings("ignore:Fixed parameter loss.reward_scale:UserWarning")
def test_a_pack_trains_its_trials_in_their_folders_and_fails_only_the_diverged_one(
    config_file: Path, storage: str, tmp_path: Path
) -> None:
    """Trials 0-2 in one `trial --trials` process: trial 1's rewards overflow float32, so its guard freezes it
    and it alone is told FAIL; the pack exits 0 and each trial's folder holds what `trainer train` writes."""
    space = {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-3}, "loss.reward_scale": {"type": "float",
             "low": 0.5, "high": 2.0}}  # fmt: skip
    params = [{"loss.reward_scale": 1.0}, {"loss.reward_scale": 1e39}, {"loss.reward_scale": 2.0}]
    asked(storage, [{**p, "optim.lr": 5e-4} for p in params], space)
    code, stdout, stderr = invoke("trial", "--trials", "0,1,2", "--config", str(config_file), "--storage", storage,
                                  "--study", "packs", "--run-dir", str(tmp_path / "search"))  # fmt: skip
    assert code == 0, stderr
    assert states(storage, "packs") == {0: TrialState.COMPLETE, 1: TrialState.FAIL, 2: TrialState.COMPLETE}
    assert "error: trial 1 failed: its run diverged" in stdout and "[run 1 seed 0 trial 1] diverged" in stdout
    values = {t.number: t.value for t in optuna.load_study(study_name="packs", storage=storage).get_trials()}
    for number in (0, 2):
        summary = json.loads((tmp_path / "search" / f"trial-{number}" / "summary.json").read_text())
        assert summary["packed"] is True and summary["eval_return_mean"] == values[number]
        config = json.loads((tmp_path / "search" / f"trial-{number}" / "config.json").read_text())
        assert config["run"]["collect_graph"] is False  # a pack collects per run (on a GPU it would refuse the graph)
    progress = json.loads((tmp_path / "search" / "progress.json").read_text())  # the pack's last report
    assert [(r["run"], r["trial"], r["step"], r["diverged"]) for r in progress["runs"]] == [
        (0, 0, 10, False), (1, 1, 5, True), (2, 2, 10, False),
    ]  # fmt: skip
    assert progress["runs"][0]["eval_return"] == values[0]
    code, stdout, _ = invoke("trial", "--trials", "0,1,2", "--config", str(config_file), "--storage", storage,
                             "--study", "packs", "--run-dir", str(tmp_path / "search"))  # fmt: skip
    assert code == 0 and "trial 1: already FAIL, not trained again" in stdout  # a retried pod trains nothing


def test_a_pack_option_that_names_no_trials_is_refused(config_file: Path, storage: str) -> None:
    for bad in ("", "0,x", "1,1", "-1"):
        code, _, stderr = invoke("trial", "--trials", bad, "--storage", storage, "--study", "s")
        assert code == 2 and "--trials takes" in stderr, bad


def test_the_space_comes_from_the_space_file_else_the_configs_search_space_else_the_default(tmp_path: Path) -> None:
    searched = {"model.hidden": {"type": "categorical", "choices": [16, 32]}}
    base = build_config({**TINY, "search": {"space": searched}})
    assert load_space(None, base) == parse_space(searched)
    assert load_space(None, build_config(TINY)) == parse_space(DEFAULT_SPACE)
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump({"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-3}}))
    assert list(load_space(space_file, base)) == ["optim.lr"]


def test_suggest_checks_and_searches_the_space_its_config_carries(tmp_path: Path, storage: str) -> None:
    """A job's config carries its space to the suggest step (the controller passes the config, not a file)."""
    config = tmp_path / "searched.yaml"
    config.write_text(yaml.safe_dump({**TINY, "search": {"space": {"replay.alpha": {"type": "float", "low": 0.5,
                                                                                     "high": 2.0}}}}))  # fmt: skip
    code, _, stderr = invoke("suggest", "--config", str(config), "--trials", "2", "--storage", storage, "--study", "s")
    assert code == 2 and stderr.startswith("error: space replay.alpha: 2.0 does not make a valid config")
    hidden = {"model.hidden": {"type": "categorical", "choices": [16]}, "optim.lr": DEFAULT_SPACE["optim.lr"]}
    config.write_text(yaml.safe_dump({**TINY, "search": {"space": hidden}}))
    code, stdout, stderr = invoke("suggest", "--config", str(config), "--trials", "2", "--storage", storage,
                                  "--study", "t")  # fmt: skip
    assert (code, json.loads(stdout)) == (0, ["0,1"]) and "model.hidden=16 optim.lr=" in stderr
    assert "the space searches model.hidden, which a pack's runs cannot vary" in stderr
