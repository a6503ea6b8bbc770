"""`trainer sweep`: every seed trains in its own process, each row is recorded, a failed seed fails the sweep."""

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts.config import ConfigError
from trainer.tools.sweep import (
    EXIT_BELOW_THRESHOLD,
    EXIT_SEED_FAILED,
    Row,
    SweepOptions,
    build_document,
    exit_code,
    format_markdown,
    parse_seeds,
    read_row,
    run_sweep,
    seed_argv,
    verdict,
)

# CartPole with tiny widths: each seed's process trains 20 updates, evaluates twice on the way (best
# policy kept) and 2 episodes at the end.
TINY_CARTPOLE = """
model: {hidden: 16, head_hidden: 16, iqn_hidden: 16, iqn_embed: 8, iqn_taus: 4, iqn_target_taus: 4,
        v_min: -1, v_max: 11}
loss: {reward_scale: 0.1, iql: false, attention: false}
optim: {spectral_norm: false}
replay: {capacity: 256, her: false}
data: {source: gym, env_id: CartPole-v1, learning_starts: 32}
run: {steps: 20, batch_size: 16, device: cpu, log_every: 10, checkpoint_every: 20, eval_episodes: 2,
      eval_every: 10, eval_select_episodes: 1}
"""


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CARTPOLE)
    return path


def sweep_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", "sweep", *args], capture_output=True, text=True, timeout=timeout
    )


def test_a_sweep_trains_every_seed_and_records_each_row(tmp_path: Path, recipe: Path) -> None:
    out = tmp_path / "sweep"
    result = sweep_cli(
        "--config", str(recipe), "--seeds", "4,5", "--jobs", "2", "--out", str(out), "--threshold", "0", "--poll", "1"
    )
    assert result.returncode == 0, result.stderr
    document = json.loads((out / "sweep.json").read_text())
    rows = {row["seed"]: row for row in document["rows"]}
    assert sorted(rows) == [4, 5]
    for seed, row in rows.items():
        assert row["status"] == "ok" and row["exit_code"] == 0
        assert row["steps"] == 20 and row["eval_episodes"] == 2
        assert row["eval_return_min"] <= row["eval_return_mean"]
        assert row["best_eval_step"] in (10, 20)
        assert row["wall_seconds"] > 0 and row["train_seconds"] > 0
        assert row["reached"] is True
        assert row["command"].startswith(f"python -m trainer train --config {recipe} --run-dir {out / f'seed-{seed}'}")
        assert f"-o run.seed={seed} -o run.cpu_threads=1" in row["command"]
        # each process trained its own seed on one thread, and its summary is the row's source
        resolved = json.loads((out / f"seed-{seed}" / "config.json").read_text())
        assert resolved["run"]["seed"] == seed and resolved["run"]["cpu_threads"] == 1
        summary = json.loads((out / f"seed-{seed}" / "summary.json").read_text())
        assert summary["eval_return_mean"] == row["eval_return_mean"]
        assert min(summary["eval_returns"]) == row["eval_return_min"]
    assert document["verdict"]["outcome"] == "passed"
    # the table is printed last and written beside the JSON, one row per seed with its command
    table = (out / "sweep.md").read_text()
    assert result.stdout == table
    assert "| 4 |" in table and "| 5 |" in table and "Verdict: passed: all 2 seeds reached 0." in table
    assert "seed 4 started" in result.stderr and "seed 5 finished" in result.stderr


def test_a_packed_sweep_trains_its_seeds_in_one_process_and_records_each_row(tmp_path: Path, recipe: Path) -> None:
    """`--pack 2`: seeds 4 and 5 as one `trainer train-pack` process, each seed's folder and row as in a sweep of
    processes. Then a sweep whose rewards overflow float32: its pack freezes both seeds at their first report,
    their rows are failed and say so, and the sweep exits 1 (one run frozen among others: test_pack_train.py)."""
    out = tmp_path / "sweep"
    overrides = ["--override", "run.plan=eager"]
    result = sweep_cli(
        "--config", str(recipe), "--seeds", "4,5", "--pack", "2", "--out", str(out), "--poll", "1", *overrides
    )
    assert result.returncode == 0, result.stderr
    rows = {row["seed"]: row for row in json.loads((out / "sweep.json").read_text())["rows"]}
    assert sorted(rows) == [4, 5]
    for seed, row in rows.items():
        assert row["status"] == "ok" and row["steps"] == 20 and row["eval_episodes"] == 2
        assert row["command"].startswith(f"python -m trainer train-pack --config {recipe} --seeds 4,5 --out {out}")
        assert json.loads((out / f"seed-{seed}" / "config.json").read_text())["run"]["seed"] == seed
    assert (out / "pack-4-5.log").exists()
    diverging = sweep_cli(
        "--config", str(recipe), "--seeds", "6,7", "--pack", "2", "--out", str(tmp_path / "b"), "--poll", "1",
        "-o", "run.plan=eager", "-o", "loss.reward_scale=1e39",
    )  # fmt: skip
    assert diverging.returncode == 1  # EXIT_SEED_FAILED
    rows = {row["seed"]: row for row in json.loads((tmp_path / "b" / "sweep.json").read_text())["rows"]}
    assert all(row["status"] == "failed" and row["diverged_at_step"] == 10 for row in rows.values())


def test_a_seed_whose_process_fails_fails_the_sweep_loudly(tmp_path: Path, recipe: Path) -> None:
    out = tmp_path / "sweep"
    (out / "seed-5" / "config.json").mkdir(parents=True)  # the trainer cannot write its resolved config: it crashes
    result = sweep_cli("--config", str(recipe), "--seeds", "4,5", "--jobs", "2", "--out", str(out))
    assert result.returncode == EXIT_SEED_FAILED
    rows = {row["seed"]: row for row in json.loads((out / "sweep.json").read_text())["rows"]}
    assert rows[4]["status"] == "ok"  # the other seed still ran to the end
    assert rows[5]["status"] == "failed" and rows[5]["exit_code"] == 1
    assert rows[5]["error"].startswith("exit code 1: ") and "IsADirectoryError" in rows[5]["error"]
    assert "seed 5 FAILED" in result.stderr
    assert result.stderr.rstrip().endswith("error: failed: seeds [5] did not finish")
    assert "| 5 | **failed** (exit code 1" in result.stdout


def test_a_stop_request_terminates_running_seeds_and_skips_queued_ones(tmp_path: Path, recipe: Path) -> None:
    asked = iter([False, False, True])
    options = SweepOptions(recipe, [4, 5], tmp_path / "sweep", jobs=1, overrides=["run.steps=1000000"], poll_seconds=1)
    document = run_sweep(options, lambda line: None, should_stop=lambda: next(asked, True))
    first, second = document["rows"]
    assert first["status"] == "failed" and first["exit_code"] != 0  # SIGTERM'd while it ran
    assert second == {**second, "status": "failed", "error": "not started", "exit_code": None}
    assert exit_code(document) == EXIT_SEED_FAILED


def row(seed: int, mean: float | None, status: str = "ok") -> Row:
    return Row(seed, "ok" if status == "ok" else "failed", "python -m trainer train", eval_return_mean=mean)


def test_verdict_needs_every_seed_at_the_threshold() -> None:
    rows = [row(4, 480.0), row(5, 475.0)]
    assert verdict(rows, 475.0)["outcome"] == "passed" and all(r.reached for r in rows)
    rows = [row(4, 480.0), row(5, 474.9), row(6, None)]
    result = verdict(rows, 475.0)
    assert result["outcome"] == "below_threshold" and result["below_threshold_seeds"] == [5, 6]
    assert [r.reached for r in rows] == [True, False, False]
    assert exit_code({"verdict": result}) == EXIT_BELOW_THRESHOLD
    failed = verdict([row(4, 480.0), row(5, None, status="failed")], 475.0)
    assert failed["outcome"] == "failed" and failed["failed_seeds"] == [5]
    assert verdict([row(4, -500.0)], None)["outcome"] == "ran"


@pytest.mark.parametrize(
    ("flags", "stopped", "cell"),
    [
        ({"stopped_at_return": True, "stopped_by_time_limit": False}, "return reached", "| 14,000 (return reached) |"),
        ({"stopped_at_return": False, "stopped_by_time_limit": True}, "time limit", "| 14,000 (time limit) |"),
        ({"stopped_at_return": False, "stopped_by_time_limit": False}, None, "| 14,000 |"),
    ],
)
def test_the_table_says_why_a_run_ended_before_its_steps(
    tmp_path: Path, recipe: Path, flags: dict[str, bool], stopped: str | None, cell: str
) -> None:
    summary = {"step": 14000, "eval_returns": [500.0, 490.0], "eval_return_mean": 495.0, **flags}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    seen = read_row(4, "python -m trainer train", tmp_path, exit_code=0, wall_seconds=9.0)
    assert (seen.status, seen.steps, seen.stopped) == ("ok", 14000, stopped)
    document = build_document(SweepOptions(recipe, [4], tmp_path), [seen], datetime.now(UTC), 9.0)
    assert cell in format_markdown(document)


def test_seeds_parse_as_lists_and_ranges() -> None:
    assert parse_seeds("4,5,6") == [4, 5, 6]
    assert parse_seeds("4-6, 9") == [4, 5, 6, 9]
    for bad in ("", "a", "4,4", "6-4", "-1"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_the_sweep_owns_the_seed_and_overrides_follow_its_defaults(tmp_path: Path, recipe: Path) -> None:
    options = SweepOptions(recipe, [4], tmp_path, overrides=["run.cpu_threads=2"], python="py")
    argv = seed_argv(options, 4)
    assert argv[:4] == ["py", "-m", "trainer", "train"]
    assert argv[-6:] == ["-o", "run.seed=4", "-o", "run.cpu_threads=1", "-o", "run.cpu_threads=2"]
    with pytest.raises(ConfigError, match="run.seed"):
        seed_argv(SweepOptions(recipe, [4], tmp_path, overrides=["run.seed=3"]), 4)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "4,5"], "error: --config is required"),
        (["--seeds", "x", "--config", "examples/cartpole.yaml"], "error: --seeds: 'x' is not a seed"),
        (["--seeds", "4", "--config", "examples/cartpole.yaml", "-o", "run.seed=1"], "error: override run.seed"),
        (["--seeds", "4", "--config", "missing.yaml"], "error: config file not found: missing.yaml"),
    ],
)
def test_bad_input_exits_2_before_any_training(tmp_path: Path, args: list[str], message: str) -> None:
    result = sweep_cli(*args, "--out", str(tmp_path / "sweep"), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message)
    assert not (tmp_path / "sweep").exists()
