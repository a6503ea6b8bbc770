"""The trainer CLI: bad input (one line on stderr, exit code 2) and the pipeline's own commands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner, Result

from contracts.config import STEPS_PER_EPOCH, load_config
from tests.import_guard import trainer_cli_without
from trainer.cli import app


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", "train", *args, "--no-progress"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize(
    "setup, args, message",
    [
        (None, ["--config", "missing.yaml"], "error: config file not found: missing.yaml"),
        ("model: [\n", ["--config", "c.yaml"], "error: config file c.yaml is not valid YAML/JSON"),
        ("optim:\n  lr: -3\n", ["--config", "c.yaml"], "error: optim.lr: Input should be greater than 0 (got -3)"),
        (None, ["-o", "run.steps=zero"], "error: run.steps: Input should be a valid integer"),
        (None, ["-o", "data.source=offline", "-o", "data.dataset=none.npz"], "error: "),
    ],
)
def test_bad_input_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setup: str | None, args: list[str], message: str
) -> None:
    """In this process (a fresh interpreter per case only re-imports torch); the next test runs the real one."""
    if setup is not None:
        (tmp_path / "c.yaml").write_text(setup)
    monkeypatch.chdir(tmp_path)
    result = invoke("train", *args, "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1, result.stderr


def test_malformed_dataset_exits_2(tmp_path: Path) -> None:
    """`python -m trainer` as a process: bad input is one line on its stderr and exit code 2."""
    path = tmp_path / "bad.npz"
    np.savez(path, obs=np.zeros((4, 3), np.float32))  # no action/reward/next_obs/done
    result = run_cli("-o", "data.source=offline", "-o", f"data.dataset={path}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and str(path) in result.stderr
    assert result.stderr.count("\n") == 1


# ---- the pipeline's own commands: resolve, check, report, finish ----------------------------------

TINY = [
    "-o", "run.batch_size=16", "-o", "replay.capacity=512", "-o", "data.learning_starts=64",
    "-o", "model.hidden=32", "-o", "model.head_hidden=32", "-o", "run.cpu_threads=1",
]  # fmt: skip


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_check_runs_a_few_updates_of_the_config_and_never_touches_the_jobs_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_checkpoints = tmp_path / "job-checkpoints"
    monkeypatch.setenv("FOXHUNT_CHECKPOINT_URL", str(job_checkpoints))
    result = invoke("check", "-c", "examples/quickstart.yaml", *TINY, "--out", str(tmp_path / "check"), "--steps", "3")
    assert result.exit_code == 0, result.output
    check = json.loads((tmp_path / "check" / "check.json").read_text())
    assert check["steps"] == 3 and check["plan"] == check["plan_requested"] == "eager"
    assert not job_checkpoints.exists()  # train --resume must not start from the check's updates
    assert os.environ["FOXHUNT_CHECKPOINT_URL"] == str(job_checkpoints)


def test_check_fails_when_the_config_asks_for_a_gpu_this_machine_lacks(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = invoke("check", "-c", "examples/quickstart.yaml", *TINY, "-o", "run.device=cuda", "--steps", "1",
                    "--out", str(tmp_path / "check"))  # fmt: skip
    assert result.exit_code == 1
    assert "no usable CUDA GPU" in result.output


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_check_fails_when_the_plan_would_fall_back_whatever_the_device_says(tmp_path: Path, device: str) -> None:
    """The default device is auto: a graph plan on a machine without a usable GPU must fail compile, not
    train on the CPU for hours."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = invoke("check", "-c", "examples/quickstart.yaml", *TINY, "-o", f"run.device={device}",
                    "-o", "run.plan=graph", "--steps", "1", "--out", str(tmp_path / "check"))  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "plan graph cannot run here: plan 'graph' needs a CUDA GPU" in result.output


def test_train_checkpoints_where_the_environment_says_read_once_by_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_checkpoints = tmp_path / "job-checkpoints"
    monkeypatch.setenv("FOXHUNT_CHECKPOINT_URL", str(job_checkpoints))
    result = invoke(
        "train", "-c", "examples/quickstart.yaml", *TINY, "--run-dir", str(tmp_path / "run"), "--no-progress"
    )
    assert result.exit_code == 0, result.output
    assert any(job_checkpoints.iterdir()) and not (tmp_path / "run" / "checkpoints").exists()


def quickstart_without_steps(tmp_path: Path) -> Path:
    """examples/quickstart.yaml less its run.steps: a config whose length a job's epochs may set."""
    document = yaml.safe_load(Path("examples/quickstart.yaml").read_text())
    del document["run"]["steps"]
    path = tmp_path / "no-steps.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_resolve_turns_the_jobs_epochs_into_run_steps_of_the_config_it_writes(tmp_path: Path) -> None:
    resolved = tmp_path / "job" / "config.json"
    result = invoke("resolve", "-c", str(quickstart_without_steps(tmp_path)), *TINY, "--train-epochs", "3",
                    "--out", str(resolved))  # fmt: skip
    assert result.exit_code == 0, result.output
    written = load_config(resolved)
    assert written.run.steps == 3 * STEPS_PER_EPOCH == 6000
    assert written.run.batch_size == 16 and written.model.hidden == 32  # the rest is the config's, overrides in
    assert result.output == f"resolved config: {resolved} (model dqn, 6000 steps, plan eager)\n"


def test_resolve_without_epochs_writes_the_config_as_it_is(tmp_path: Path) -> None:
    resolved = tmp_path / "config.json"
    result = invoke("resolve", "-c", "examples/quickstart.yaml", *TINY, "--out", str(resolved))
    assert result.exit_code == 0, result.output
    assert load_config(resolved) == load_config("examples/quickstart.yaml", TINY[1::2])


def test_check_runs_the_config_resolve_wrote(tmp_path: Path) -> None:
    """The pipeline's order: resolve writes the config, compile (`trainer check`) runs that file's plan."""
    resolved = tmp_path / "run" / "config.json"
    assert invoke("resolve", "-c", "examples/quickstart.yaml", *TINY, "--out", str(resolved)).exit_code == 0
    result = invoke("check", "-c", str(resolved), "--out", str(tmp_path / "run" / "check"), "--steps", "2")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "check" / "check.json").read_text())["steps"] == 2


POOLS = "pools:\n  - name: h100\n    gpu_type: nvidia-h100-80gb\n  - name: dev\n    gpu_type: nvidia-l4\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "c51-branching"], "error: model 'c51-branching' is not one this trainer trains; models: dqn\n"),
        (["--train-epochs", "2"], "error: the config sets run.steps (240) and the job asks for 2 epochs: give one"),
        (["--pool", "a100", "--pools-file", "{pools}"], "error: unknown pool 'a100'; configured: h100, dev\n"),
        (["--pool", "h100", "--pools-file", "{missing}"], "error: pools file not found: "),
        (["--pool", "h100", "--pools-file", "{bad}"], "error: pools file "),
        (["-o", "run.pushgateway_url=http://127.0.0.1:8000/v1/jobs"], "error: run.pushgateway_url is the operator's"),
        (
            ["-o", "data.env_id=foxhunt_planted_env:Env"],
            "error: data.env_id: Value error, 'foxhunt_planted_env:Env' is "
            "module-qualified (module:Name): Gymnasium would import that module",
        ),
    ],
    ids=["model", "epochs-and-steps", "pool", "no-pools-file", "bad-pools-file", "pushgateway", "module-env-id"],
)
def test_resolve_refuses_what_the_job_asks_wrongly(tmp_path: Path, args: list[str], message: str) -> None:
    """Bad input (exit 2, one line): nothing is written, so no later step can run."""
    (tmp_path / "pools.yaml").write_text(POOLS)
    (tmp_path / "bad.yaml").write_text("pools: 3\n")
    paths = {"pools": tmp_path / "pools.yaml", "missing": tmp_path / "none.yaml", "bad": tmp_path / "bad.yaml"}
    resolved = tmp_path / "run" / "config.json"
    result = invoke("resolve", "-c", "examples/quickstart.yaml", *TINY, *(a.format(**paths) for a in args),
                    "--out", str(resolved))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert not resolved.parent.exists()


def test_a_config_run_by_hand_may_still_name_its_pushgateway(tmp_path: Path) -> None:
    """Only a job's config may not (its resolve step refuses it, above): `trainer train` pushes where it says."""
    result = invoke("train", "-c", "examples/quickstart.yaml", *TINY, "-o", "run.steps=2",
                    "-o", "run.pushgateway_url=http://pushgateway.invalid:9091",
                    "--run-dir", str(tmp_path / "run"), "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning: metrics not pushed to http://pushgateway.invalid:9091" in result.stderr


def test_resolve_accepts_a_pool_the_pools_file_names(tmp_path: Path) -> None:
    (tmp_path / "pools.yaml").write_text(POOLS)
    result = invoke("resolve", "-c", "examples/quickstart.yaml", *TINY, "--pool", "dev", "--pools-file",
                    str(tmp_path / "pools.yaml"), "--out", str(tmp_path / "config.json"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "config.json").is_file()


NO_TORCH = trainer_cli_without("torch", "torch imported by trainer resolve")


def test_resolve_runs_without_torch(tmp_path: Path) -> None:
    """The pipeline's first step runs in a tiny CPU pod and answers in a second: it never imports torch."""
    pools, resolved = tmp_path / "pools.yaml", tmp_path / "config.json"
    pools.write_text(POOLS)

    def resolve(pool: str) -> subprocess.CompletedProcess[str]:
        args = ["resolve", "-c", "examples/quickstart.yaml", "--pool", pool, "--pools-file", str(pools)]
        return subprocess.run([sys.executable, "-c", NO_TORCH, *args, "--out", str(resolved)],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    accepted = resolve("h100")
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert load_config(resolved).run.steps == 240
    refused = resolve("a100")
    assert refused.returncode == 2 and refused.stderr == "error: unknown pool 'a100'; configured: h100, dev\n"


def test_report_prints_the_breakdown_then_the_summary_as_one_json_line(tmp_path: Path) -> None:
    summary = {"plan": "graph", "step": 10, "breakdown_ms": {"sample": 0.5, "forward_backward": 1.25}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    result = invoke("report", "--run-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    breakdown, last = result.output.strip().splitlines()
    assert breakdown.startswith("Training step breakdown: sample=0.500ms fused=1.250ms")
    assert json.loads(last) == summary


def test_report_of_an_unfinished_run_is_bad_input(tmp_path: Path) -> None:
    result = invoke("report", "--run-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "has not finished" in result.output


def test_finish_records_the_outcome_beside_the_run(tmp_path: Path) -> None:
    failures = '[{"displayName":"train","message":"OOMKilled"}]'
    result = invoke("finish", "--run", str(tmp_path / "job"), "--status", "Failed", "--duration", "61.5",
                    "--failures", failures)  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "job" / "status.json").read_text())
    assert record == {"status": "Failed", "duration_seconds": 61.5, "failures": json.loads(failures)}
    bad = invoke("finish", "--run", str(tmp_path), "--status", "Failed", "--duration", "soon")
    assert bad.exit_code == 2


# ---- train without --config ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        ([], True),  # the default: the market, 2000 steps of batch 1024
        (["-o", "run.device=cpu", "-o", "run.steps=5"], True),
        (["-o", "data.source=gym", "-o", "data.env_id=CartPole-v1"], False),
        (["--config", "examples/quickstart.yaml"], False),
    ],
)
def test_train_without_a_config_warns_before_a_gpu_sized_run_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], warned: bool
) -> None:
    if torch.cuda.is_available():
        pytest.skip("the warning is for machines without a GPU")
    started: list[int] = []
    monkeypatch.setattr("trainer.runtime.train.run_training", lambda config, *a, **k: started.append(config.run.steps))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    result = invoke("train", *args, "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert len(started) == 1
    warning = "warning: no --config: the default TrainConfig is a GPU-sized run"
    assert (warning in result.stderr) is warned, result.stderr
    if warned:
        assert f"({started[0]} steps of batch" in result.stderr and "--config examples/quickstart.yaml" in result.stderr


def test_resume_on_a_folder_without_a_checkpoint_says_it_starts_at_step_0(tmp_path: Path) -> None:
    gym = ["-o", "data.source=gym", "-o", "data.env_id=CartPole-v1", "-o", "run.steps=2"]
    result = invoke("train", *TINY, *gym, "--run-dir", str(tmp_path / "run"), "--resume", "--no-progress")
    assert result.exit_code == 0, result.output
    assert f"--resume: no checkpoint in {tmp_path / 'run' / 'checkpoints'}; starting at step 0" in result.stdout
    resumed = invoke("train", *TINY, *gym, "--run-dir", str(tmp_path / "run"), "--resume", "--no-progress")
    assert "resumed from checkpoint at step 2" in resumed.stdout and "no checkpoint" not in resumed.stdout
