"""The `foxhunt` CLI against a live controller (HTTP) and its database (tokens)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from service.app import GC_YOUNG_THRESHOLD
from service.cli import app
from service.settings import Settings
from tests.polling import wait_until
from tests.service.conftest import Controller
from tests.service.factories import live_server, make_settings, stand_in_command

runner = CliRunner()


@pytest.fixture
def served(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Controller, str]]:
    # no token cache: the revocation test expects a revoked token refused at once (auth's tests cover the TTL)
    settings = make_settings(tmp_path, local_command=stand_in_command("--sleep", "0.5"), token_cache_seconds=0)
    monkeypatch.setenv("FOXHUNT_DATABASE_URL", settings.database_url)
    controller = controller_factory(settings)
    with live_server(controller.app) as url:
        monkeypatch.setenv("FOXHUNT_API_URL", url)
        yield controller, url


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_tokens_are_created_listed_and_revoked_in_the_database(served: tuple[Controller, str]) -> None:
    created = json.loads(invoke("token", "create", "--tenant", "team-z", "--name", "ci", "--json"))
    assert created["token"].startswith("fxh_") and created["tenant"] == "team-z"
    listed = json.loads(invoke("token", "list", "--json"))
    assert [t["name"] for t in listed][-1] == "ci" and "token" not in listed[-1]
    assert "team-z" in invoke("token", "list")
    invoke("jobs", "list", "--token", created["token"])  # the new token works against the API
    assert invoke("token", "revoke", str(created["id"])).strip() == f"revoked {created['id']}"
    again = runner.invoke(app, ["token", "revoke", str(created["id"])])
    assert again.exit_code == 1 and f"no live token with id {created['id']}" in again.output
    rejected = runner.invoke(app, ["jobs", "list", "--token", created["token"]])
    assert rejected.exit_code == 1 and "401: unknown or revoked token" in rejected.output


def test_submit_with_hyperopt_trials_runs_the_search_locally(served: tuple[Controller, str], tmp_path: Path) -> None:
    controller, _ = served
    token = controller.headers["alice"]["Authorization"].split()[1]
    config = tmp_path / "job.yaml"
    config.write_text("run: {steps: 2}\n")
    out = invoke("submit", "-c", str(config), "--pool", "cpu", "--hyperopt-trials", "2", "--follow", "--token", token)
    job_id = out.splitlines()[0].split()[0]
    for step in ("hyperopt-suggest", "hyperopt-trial 0", "hyperopt-trial 1", "hyperopt-best", "train"):
        assert f"--- foxhunt: step {step} starting: " in out
    assert "hyperopt suggest --config " in out and " --trials 2 " in out
    assert json.loads(invoke("jobs", "show", job_id, "--json", "--token", token))["hyperopt_trials"] == 2
    refused = runner.invoke(app, ["submit", "--hyperopt-trials", "-1", "--token", token])
    assert refused.exit_code == 2


def test_submit_space_gives_the_job_its_search_space_and_prints_what_it_means_for_packs(
    served: tuple[Controller, str], tmp_path: Path
) -> None:
    controller, _ = served
    token = controller.headers["alice"]["Authorization"].split()[1]
    space = tmp_path / "space.yaml"
    space.write_text(
        "model.hidden: {type: categorical, choices: [16, 32]}\noptim.lr: {type: float, low: 1.0e-4, high: 1.0e-3}\n"
    )
    out = invoke("submit", "--pool", "cpu", "--hyperopt-trials", "4", "--space", str(space), "--token", token)
    job_id = out.splitlines()[0].split()[0]
    assert out.splitlines()[1].startswith("note: the search space varies model.hidden, which the runs of a pack")
    shown = json.loads(invoke("jobs", "show", job_id, "--json", "--token", token))
    assert list(shown["config"]["search"]["space"]) == ["model.hidden", "optim.lr"]
    assert "QUEUED the search space varies model.hidden" in invoke("jobs", "show", job_id, "--token", token)
    invoke("jobs", "cancel", job_id, "--token", token)
    missing = runner.invoke(app, ["submit", "--space", str(tmp_path / "nope.yaml"), "--token", token])
    assert missing.exit_code == 2 and "space file not found" in missing.output
    unknown = runner.invoke(app, ["submit", "--hyperopt-trials", "2", "--space", str(space), "--token", token,
                                  "--config", str(_write(tmp_path / "c.yaml", "model: {hiddn: 3}\n"))])  # fmt: skip
    assert unknown.exit_code == 1 and "422" in unknown.output


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_submit_follow_list_show_cancel_retry(served: tuple[Controller, str], tmp_path: Path) -> None:
    controller, _ = served
    token = controller.headers["alice"]["Authorization"].split()[1]
    config = tmp_path / "job.yaml"
    config.write_text("run: {steps: 2}\n")
    out = invoke(
        "submit", "-c", str(config), "--pool", "cpu", "--name", "cli-job", "-l", "exp=cli", "--follow", "--token", token
    )
    job_id, state = out.splitlines()[0].split()
    assert job_id.startswith("job-") and state == "QUEUED" and "stand-in: done, exit 0" in out
    again = json.loads(
        invoke(
            "submit",
            "-c",
            str(config),
            "--pool",
            "cpu",
            "--name",
            "cli-job",
            "-l",
            "exp=cli",
            "--json",
            "--token",
            token,
        )
    )
    assert again["id"] == job_id
    wait_until(
        lambda: json.loads(invoke("jobs", "show", job_id, "--json", "--token", token))["state"] == "SUCCEEDED",
        timeout=30,
        what=f"{job_id} to succeed",
    )
    shown = invoke("jobs", "show", job_id, "--token", token)
    assert "SUCCEEDED" in shown and "breakdown: sample=0.250ms fused=1.000ms guard=0.250ms" in shown
    # The stand-in reports epoch_seconds 3.0; the line says it is a projection, not the job's run time.
    assert "epoch_seconds: 3.0  (projected: 2000 steps at the last reported step time" in shown
    listed = json.loads(invoke("jobs", "list", "-l", "exp=cli", "--all", "--limit", "1", "--json", "--token", token))
    assert [j["id"] for j in listed] == [job_id]
    assert job_id in invoke("jobs", "list", "--token", token)
    assert "stand-in: steps=2" in invoke("jobs", "logs", job_id, "--token", token)
    refused = runner.invoke(app, ["jobs", "cancel", job_id, "--token", token])
    assert refused.exit_code == 1 and "409: job" in refused.output and "already SUCCEEDED" in refused.output
    retry = runner.invoke(app, ["jobs", "retry", job_id, "--token", token])
    assert retry.exit_code == 1 and "only FAILED, CANCELLED or ERROR" in retry.output


def test_submit_takes_the_model_and_the_epochs_as_the_api_does(served: tuple[Controller, str], tmp_path: Path) -> None:
    controller, _ = served
    token = controller.headers["alice"]["Authorization"].split()[1]
    with_steps, without = tmp_path / "steps.yaml", tmp_path / "seed.yaml"
    with_steps.write_text("run: {steps: 2}\n")
    without.write_text("run: {seed: 3}\n")
    job = json.loads(invoke("submit", "-c", str(without), "--pool", "cpu", "--model", "dqn", "--epochs", "2",
                            "--json", "--token", token))  # fmt: skip
    assert (job["model"], job["epochs"]) == ("dqn", 2) and "steps" not in job["config"]["run"]
    both = runner.invoke(app, ["submit", "-c", str(with_steps), "--pool", "cpu", "--epochs", "2", "--token", token])
    assert both.exit_code == 1 and "422: " in both.output
    assert "the config sets run.steps (2) and the job asks for 2 epochs: give one" in both.output
    model = runner.invoke(app, ["submit", "-c", str(with_steps), "--pool", "cpu", "--model", "c51", "--token", token])
    assert model.exit_code == 1 and "model 'c51' is not one this trainer trains; models: dqn" in model.output
    pool = runner.invoke(app, ["submit", "-c", str(with_steps), "--pool", "a100", "--token", token])
    assert pool.exit_code == 1 and "422: unknown pool 'a100'; configured: cpu, h200" in pool.output
    runner.invoke(app, ["jobs", "cancel", job["id"], "--token", token])


def test_bad_input_and_unreachable_api_fail_in_one_line(served: tuple[Controller, str], tmp_path: Path) -> None:
    missing = runner.invoke(app, ["submit", "-c", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "config file not found" in missing.output
    bad_label = runner.invoke(app, ["submit", "-l", "nolabel"])
    assert bad_label.exit_code == 2 and "expected key=value" in bad_label.output
    down = runner.invoke(app, ["jobs", "list", "--api-url", "http://127.0.0.1:9"])
    assert down.exit_code == 1 and "cannot reach http://127.0.0.1:9" in down.output
    unknown = runner.invoke(app, ["jobs", "show", "job-nope", "--token", "fxh_bad"])
    assert unknown.exit_code == 1 and "401" in unknown.output


def test_python_dash_m_service_is_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "service", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "serve" in result.stdout and "token" in result.stdout


def test_the_job_view_shows_each_run_of_a_pack(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import _print_job

    runs = [
        {"run": 0, "seed": 7, "trial": 4, "step": 300, "train_return": 21.5, "eval_return": 30.25, "diverged": False},
        {"run": 1, "seed": 7, "trial": 5, "step": 100, "train_return": None, "eval_return": None, "diverged": True},
    ]
    _print_job({"id": "job-1", "state": "RUNNING", "step": 300, "runs": runs, "history": []}, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("runs:"))
    assert lines[start].split(":", 1)[1].split() == ["run", "seed", "trial", "step", "train", "eval"]
    assert lines[start + 1].split() == ["0", "7", "4", "300", "21.50", "30.25"]
    assert lines[start + 2].split() == ["1", "7", "5", "100", "diverged", "(frozen)"]


def test_serve_freezes_what_it_built_before_it_serves(
    served_settings: Settings, monkeypatch: pytest.MonkeyPatch, gc_restored: None
) -> None:
    """The garbage collector's full collections skip the objects built at start (gc.freeze) and young collections
    run every GC_YOUNG_THRESHOLD allocations, from before the first request (docs/benchmarks/submit-latency.md,
    round 4: the collector took a tenth of a submission's CPU, its full collections up to 100 ms each)."""
    when_served: dict[str, int] = {}

    def run(*_args: object, **_kwargs: object) -> None:
        when_served.update(frozen=gc.get_freeze_count(), young=gc.get_threshold()[0])

    monkeypatch.setattr(uvicorn, "run", run)
    gc.unfreeze()
    invoke("serve")
    assert when_served["frozen"] > 0 and when_served["young"] == GC_YOUNG_THRESHOLD
