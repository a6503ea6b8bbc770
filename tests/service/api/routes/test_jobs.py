"""/v1/jobs through the app: status codes, problem+json bodies, tenancy, quotas, cancel, retry, logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from service.api.routes import jobs as job_routes
from service.domain import BackendStatus, JobState
from service.progress import progress_token
from service.settings import DEFAULT_LOCAL_COMMAND, Settings
from tests.polling import wait_until
from tests.service.conftest import Controller
from tests.service.factories import live_server, make_settings, stand_in_command, tiny_train_config

PROBLEM = "application/problem+json"


def _submit(c: Controller, *, key: str | None = None, as_: str = "alice", **body: object) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    payload = {"config": {"run": {"steps": 2}}, "pool": "cpu", **body}
    return c.request("POST", "/v1/jobs", as_=as_, json=payload, headers=headers)


def _wait_for_log(c: Controller, job_id: str, text: str, timeout: float = 30.0) -> str:
    def log_with_text() -> str | None:
        log = c.request("GET", f"/v1/jobs/{job_id}/logs").text
        return log if text in log else None

    return wait_until(log_with_text, timeout, what=f"{text!r} in the log of {job_id}")


def test_submit_runs_the_job_to_success_with_history_and_breakdown(controller: Controller) -> None:
    created = _submit(controller, key="first", labels={"exp": "a"})
    assert created.status_code == 201
    body = created.json()
    assert body["state"] == "QUEUED" and body["id"].startswith("job-") and body["tenant"] == "team-a"
    assert body["config"]["run"]["steps"] == 2 and body["labels"] == {"exp": "a"}
    job = controller.wait_for(body["id"])
    assert job["state"] == "SUCCEEDED" and job["reason"] == "Completed", job
    states = [h["state"] for h in job["history"]]
    assert states[0] == "QUEUED" and "RUNNING" in states and states[-1] == "SUCCEEDED"
    assert job["breakdown_ms"] == {"sample": 0.25, "fused": 1.0, "guard": 0.25}
    assert job["epoch_seconds"] == 3.0 and job["step"] == 2
    assert job["started_at"] and job["finished_at"]


def test_same_key_same_body_returns_the_same_job_and_different_body_conflicts(controller: Controller) -> None:
    first = _submit(controller, key="k")
    again = _submit(controller, key="k")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = _submit(controller, key="k", priority=5)
    assert other.status_code == 409 and other.headers["content-type"] == PROBLEM
    assert other.json()["type"] == "urn:foxhunt:problem:idempotency-conflict"
    assert first.json()["id"] in other.json()["detail"]


def test_a_name_is_an_idempotency_key_and_keys_are_per_tenant(controller: Controller) -> None:
    first = _submit(controller, name="nightly")
    again = _submit(controller, name="nightly")
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    bobs = _submit(controller, name="nightly", as_="bob")
    assert bobs.status_code == 201 and bobs.json()["id"] != first.json()["id"]
    no_key = [_submit(controller).json()["id"] for _ in range(2)]
    assert no_key[0] != no_key[1]


def test_epochs_leave_run_steps_to_the_resolve_step_and_plan_overrides_the_config(controller: Controller) -> None:
    """The resolve step turns epochs into run.steps (contracts.config.apply_epochs), nowhere else: the stored
    config leaves run.steps out, so it and the epochs never both carry the steps."""
    body = _submit(controller, config={"run": {"seed": 4}}, epochs=2, plan="graph").json()
    assert "steps" not in body["config"]["run"] and body["config"]["run"]["seed"] == 4
    assert body["config"]["run"]["plan"] == "graph"
    assert body["epochs"] == 2 and body["plan"] == "graph" and body["model"] == "dqn"
    controller.request("DELETE", f"/v1/jobs/{body['id']}")


def test_epochs_with_run_steps_in_the_config_are_refused(controller: Controller) -> None:
    for steps in (2, 4000):  # refused even when they agree: nothing is reconciled
        both = _submit(controller, config={"run": {"steps": steps}}, epochs=2)
        assert both.status_code == 422 and both.headers["content-type"] == PROBLEM
        message = f"the config sets run.steps ({steps}) and the job asks for 2 epochs: give one"
        assert message in both.json()["detail"], both.json()
    assert controller.request("GET", "/v1/jobs", as_="root").json()["items"] == []  # nothing stored


def test_model_is_dqn_or_refused(controller: Controller) -> None:
    unknown = _submit(controller, model="c51-branching")
    assert unknown.status_code == 422 and unknown.headers["content-type"] == PROBLEM
    assert unknown.json()["errors"][0]["loc"][-1] == "model"
    assert "model 'c51-branching' is not one this trainer trains; models: dqn" in unknown.json()["detail"]
    assert _submit(controller, model="dqn").json()["model"] == "dqn"


def test_a_search_space_in_the_config_is_checked_and_a_searched_shape_is_named_in_the_jobs_message(
    controller: Controller,
) -> None:
    """The job's config carries the space its suggest step samples (`search.space`). A field a pack cannot vary
    (a shape) means trials that drew different values of it run in separate pods: the job says so from the start.
    What the suggest step would refuse is refused at submission, before anything runs."""
    hidden = {"model.hidden": {"type": "categorical", "choices": [16, 32]}}
    searched = _submit(controller, config={"run": {"steps": 2}, "search": {"space": hidden}}, hyperopt_trials=4)
    assert searched.status_code == 201, searched.text
    note = "the search space varies model.hidden, which the runs of a pack cannot vary"
    job = searched.json()
    assert job["message"].startswith(note) and job["history"][0]["message"].startswith(note)
    assert job["config"]["search"]["space"]["model.hidden"]["choices"] == [16, 32]
    assert controller.request("GET", f"/v1/jobs/{job['id']}").json()["history"][0]["message"].startswith(note)
    controller.request("DELETE", f"/v1/jobs/{job['id']}")
    default_space = _submit(controller, hyperopt_trials=4).json()  # numbers only: every trial may pack
    assert default_space["message"] is None and default_space["config"]["search"] == {"space": None}
    controller.request("DELETE", f"/v1/jobs/{default_space['id']}")
    refused = {
        "search.space: 'model.width' is not a config field to search": ({"model.width": hidden["model.hidden"]}, 4),
        "space replay.alpha: 2.0 does not make a valid config": (
            {"replay.alpha": {"type": "float", "low": 0.5, "high": 2.0}},
            4,
        ),
        "log sampling needs low > 0": ({"optim.lr": {"type": "float", "low": 0, "high": 1e-3, "log": True}}, 4),
        "search.space is the space of a hyper-parameter search: the job asks for none": (hidden, 0),
    }
    for message, (space, trials) in refused.items():
        bad = _submit(controller, config={"run": {"steps": 2}, "search": {"space": space}}, hyperopt_trials=trials)
        assert bad.status_code == 422 and bad.headers["content-type"] == PROBLEM
        assert message in bad.json()["detail"], bad.json()
    no_objective = _submit(controller, config={"run": {"steps": 2, "eval_episodes": 0}}, hyperopt_trials=2)
    assert no_objective.status_code == 422 and "run.eval_episodes is 0: the search needs" in no_objective.text
    assert controller.request("GET", "/v1/jobs", as_="root").json()["items"][0]["id"] == default_space["id"]


def test_bad_submissions_get_problem_details(controller: Controller) -> None:
    bad_config = controller.request("POST", "/v1/jobs", json={"config": {"run": {"steps": 0}}})
    assert bad_config.status_code == 422 and bad_config.headers["content-type"] == PROBLEM
    assert any(e["loc"][-1] == "steps" for e in bad_config.json()["errors"])
    unknown_field = controller.request("POST", "/v1/jobs", json={"config": {"lr": 1}})
    assert unknown_field.status_code == 422
    naive_deadline = controller.request("POST", "/v1/jobs", json={"deadline": "2030-01-01T00:00:00"})
    assert naive_deadline.status_code == 422 and "timezone" in naive_deadline.json()["detail"]
    unknown_pool = _submit(controller, pool="nope")
    assert unknown_pool.status_code == 422 and unknown_pool.json()["type"] == "urn:foxhunt:problem:unknown-pool"
    assert unknown_pool.json()["detail"] == "unknown pool 'nope'; configured: cpu, h200"
    malformed = controller.request(
        "POST", "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400 and malformed.json()["type"] == "urn:foxhunt:problem:malformed-json"


def test_submission_reads_caller_body_and_key_itself_with_the_checks_and_document_of_declared_ones(
    controller: Controller,
) -> None:
    """POST /v1/jobs solves no FastAPI dependency (solving them was about a tenth of a submission's CPU): the
    caller is checked before the body is read, the body before the Idempotency-Key, and the key's 422 and the
    OpenAPI operation (its header parameter and bearer scheme) are those of a declared Header and HTTPBearer."""
    [route] = [r for r in job_routes.router.routes if getattr(r, "name", None) == "submit_job"]
    assert route.dependant.dependencies == [] and route.dependant.header_params == []
    long_key, bad_body = {"Idempotency-Key": "k" * 257}, {"config": 5}
    unauthenticated = controller.request("POST", "/v1/jobs", as_="nobody", json=bad_body, headers=long_key)
    assert unauthenticated.status_code == 401 and unauthenticated.headers["www-authenticate"] == "Bearer"
    assert controller.request("POST", "/v1/jobs", json=bad_body, headers=long_key).json()["errors"][0]["loc"] == [
        "config"
    ]
    for key, message in (("", "at least 1 character"), ("k" * 257, "at most 256 characters")):
        refused = controller.request(
            "POST", "/v1/jobs", json={"config": {"run": {"steps": 2}}}, headers={"Idempotency-Key": key}
        )
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["errors"]
        assert error["loc"] == ["header", "idempotency-key"] and message in error["msg"]
    assert _submit(controller, key="k" * 256).status_code == 201
    operation = controller.client.app.openapi()["paths"]["/v1/jobs"]["post"]
    assert operation["security"] == [{"HTTPBearer": []}]
    [parameter] = operation["parameters"]
    assert parameter["in"] == "header" and parameter["name"] == "idempotency-key" and not parameter["required"]
    assert parameter["schema"]["anyOf"][0] == {"maxLength": 256, "minLength": 1, "type": "string"}


def test_auth_missing_unknown_and_revoked_tokens_are_401(controller: Controller) -> None:
    missing = controller.request("GET", "/v1/jobs", as_="nobody")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.headers["content-type"] == PROBLEM
    wrong = controller.request("GET", "/v1/jobs", as_="nobody", headers={"Authorization": "Bearer fxh_nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "unknown or revoked token"
    basic = controller.request("GET", "/v1/jobs", as_="nobody", headers={"Authorization": "Basic abc"})
    assert basic.status_code == 401 and "malformed" in basic.json()["detail"]
    store = controller.services.store
    bob = next(t for t in store.list_tokens() if t.name == "bob")
    assert store.revoke_token(bob.id)
    assert controller.request("GET", "/v1/jobs", as_="bob").status_code == 401


def test_tenants_see_and_cancel_only_their_own_jobs_and_admin_sees_all(controller: Controller) -> None:
    alices = _submit(controller, key="a", labels={"team": "a"}).json()["id"]
    bobs = _submit(controller, key="b", as_="bob").json()["id"]
    for method, path in (
        ("GET", f"/v1/jobs/{alices}"),
        ("DELETE", f"/v1/jobs/{alices}"),
        ("POST", f"/v1/jobs/{alices}/retry"),
        ("GET", f"/v1/jobs/{alices}/logs"),
    ):
        response = controller.request(method, path, as_="bob")
        assert response.status_code == 404, (method, path)
        assert response.json()["detail"] == f"job {alices} not found"
    assert [j["id"] for j in controller.request("GET", "/v1/jobs", as_="bob").json()["items"]] == [bobs]
    everyone = {j["id"] for j in controller.request("GET", "/v1/jobs", as_="root").json()["items"]}
    assert everyone == {alices, bobs}
    assert controller.request("GET", f"/v1/jobs/{alices}", as_="root").status_code == 200
    assert controller.request("DELETE", f"/v1/jobs/{bobs}", as_="root").status_code == 202


def test_list_filters_and_cursor_pages_are_stable(controller: Controller) -> None:
    ids = [
        _submit(controller, key=f"j{i}", labels={"exp": "x" if i % 2 else "y", "n": str(i)}).json()["id"]
        for i in range(5)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, object] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = controller.request("GET", "/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["items"]]
        _submit(controller, key=f"late{len(seen)}")  # new jobs land before the cursor, never inside the walk
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    by_label = controller.request("GET", "/v1/jobs", params={"label_selector": "exp=x,n=3"}).json()["items"]
    assert [j["id"] for j in by_label] == [ids[3]]
    by_pool = controller.request("GET", "/v1/jobs", params={"pool": "h200"}).json()["items"]
    assert by_pool == []
    by_submitter = controller.request("GET", "/v1/jobs", params={"submitter": "alice", "limit": 500}).json()
    assert len(by_submitter["items"]) == len(seen) + 3
    bad_selector = controller.request("GET", "/v1/jobs", params={"label_selector": "exp"})
    assert bad_selector.status_code == 422 and "label_selector" in bad_selector.json()["detail"]
    bad_cursor = controller.request("GET", "/v1/jobs", params={"cursor": "!!"})
    assert bad_cursor.status_code == 400 and "invalid cursor" in bad_cursor.json()["detail"]
    bad_state = controller.request("GET", "/v1/jobs", params={"state": "DONE"})
    assert bad_state.status_code == 422


def test_quota_per_tenant_per_pool_is_429(controller: Controller) -> None:
    assert _submit(controller, pool="h200").status_code == 201  # team-a: 8 of 8 GPUs
    over = _submit(controller, pool="h200")
    assert over.status_code == 429 and over.headers["content-type"] == PROBLEM
    assert over.json()["detail"] == "tenant team-a uses 8 of 8 GPUs on pool h200; a job needs 8 more"
    assert _submit(controller, pool="h200", as_="bob").status_code == 429  # team-b: default quota 0
    pools = {p["name"]: p for p in controller.request("GET", "/v1/pools").json()}
    assert pools["h200"]["used_gpus"] == 8 and pools["h200"]["quota_gpus"] == 8


def test_cancel_a_running_job_then_retry_resumes_it(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, local_command=stand_in_command("--sleep", "30")))
    job_id = _submit(c, key="long").json()["id"]
    _wait_for_log(c, job_id, "stand-in: steps=2 resume=False")
    cancelled = c.request("DELETE", f"/v1/jobs/{job_id}")
    assert cancelled.status_code == 202 and cancelled.json()["cancel_requested"] is True
    job = c.wait_for(job_id)
    assert job["state"] == "CANCELLED" and job["reason"] == "Cancelled"
    again = c.request("DELETE", f"/v1/jobs/{job_id}")
    assert again.status_code == 409 and "already CANCELLED" in again.json()["detail"]
    retried = c.request("POST", f"/v1/jobs/{job_id}/retry")
    assert retried.status_code == 202 and retried.json()["attempt"] == 1 and retried.json()["state"] == "QUEUED"
    log = _wait_for_log(c, job_id, "resume=True")  # the checkpoint of attempt 0 is reused
    assert "attempt 1 starting" in log
    not_terminal = c.request("POST", f"/v1/jobs/{job_id}/retry")
    assert not_terminal.status_code == 409 and "only FAILED, CANCELLED or ERROR" in not_terminal.json()["detail"]
    c.request("DELETE", f"/v1/jobs/{job_id}")


def test_cancelling_a_queued_job_cancels_it_before_it_starts(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, run_reconciler=False))
    job_id = _submit(c, key="q").json()["id"]
    job = c.request("DELETE", f"/v1/jobs/{job_id}").json()
    assert job["state"] == "CANCELLED" and job["reason"] == "CancelRequested"
    c.services.reconciler.reconcile_once()
    assert c.services.backend.list_statuses() == []  # never reached the backend


def test_failed_job_reports_exit_reason(tmp_path: Path, controller_factory: Callable[[Settings], Controller]) -> None:
    c = controller_factory(make_settings(tmp_path, local_command=stand_in_command("--exit", "2")))
    job = c.wait_for(_submit(c).json()["id"])
    assert job["state"] == "FAILED" and job["reason"] == "BadInput"
    assert job["message"] == "error: bad input for the stand-in"


def test_logs_follow_streams_until_the_job_ends(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, local_command=stand_in_command("--sleep", "1")))
    job_id = _submit(c).json()["id"]
    with c.client.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": True}, headers=c.headers["alice"]) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        text = "".join(r.iter_text())
    assert "Training step breakdown: sample=0.250ms" in text and "stand-in: done, exit 0\n" in text
    assert text.splitlines()[-1].startswith("--- foxhunt: step on-exit finished: exit 0")
    assert c.wait_for(job_id, timeout=10)["state"] == "SUCCEEDED"


def test_logs_follow_on_a_queued_job_waits_for_the_backend_to_start_it(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, run_reconciler=False))
    job_id = _submit(c).json()["id"]
    with (
        live_server(c.app) as url,
        httpx.Client(base_url=url, headers=c.headers["alice"], timeout=60) as client,
        client.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": True}) as r,
    ):
        assert r.status_code == 200  # headers are out while the job is still QUEUED
        assert c.request("GET", f"/v1/jobs/{job_id}").json()["state"] == "QUEUED"
        c.services.reconciler.reconcile_once()  # hands it to the backend
        text = "".join(r.iter_text())
    assert "Training step breakdown: sample=0.250ms" in text and "stand-in: done, exit 0\n" in text
    assert text.splitlines()[-1].startswith("--- foxhunt: step on-exit finished: exit 0")


def test_following_a_queued_job_hands_control_back_on_every_poll(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """Each wait yields an empty chunk, so the server stops iterating once the client has gone instead
    of keeping a worker thread polling for as long as the job stays queued."""
    c = controller_factory(make_settings(tmp_path, run_reconciler=False))
    job_id = _submit(c).json()["id"]
    lines = job_routes._logs_once_submitted(job_id, c.services.store, c.services.backend)
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(next(lines)), daemon=True)
    waiter.start()
    waiter.join(timeout=10)
    assert got == [""]
    lines.close()


def test_fifty_concurrent_identical_submissions_make_exactly_one_job(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, run_reconciler=False))
    barrier = threading.Barrier(50)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def submit(url: str) -> None:
        with httpx.Client(base_url=url, headers=c.headers["alice"], timeout=60) as client:
            barrier.wait()
            response = client.post(
                "/v1/jobs", json={"config": {"run": {"steps": 2}}}, headers={"Idempotency-Key": "same"}
            )
        with lock:
            results.append((response.status_code, response.json()["id"]))

    with live_server(c.app) as url:
        threads = [threading.Thread(target=submit, args=(url,)) for _ in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    codes = sorted(code for code, _ in results)
    assert codes == [200] * 49 + [201]
    assert len({job_id for _, job_id in results}) == 1
    assert len(c.services.store.list_jobs(limit=500)[0]) == 1


def test_a_real_job_with_two_trials_runs_the_whole_pipeline_on_cpu(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """The default trainer program (`python -m trainer`) runs every step of the job pipeline locally, with
    the commands Argo runs: resolve, compile, 2 hyper-parameter trials (the default space searches numbers only:
    suggest packs them, and one trial step trains both as one pack), best, train from the best config, report
    and the exit handler, on a tiny market config on the CPU; the job shows each trial's run of the pack."""
    c = controller_factory(make_settings(tmp_path, local_command=list(DEFAULT_LOCAL_COMMAND)))
    config = tiny_train_config(steps=4)
    config["run"]["cpu_threads"] = 1
    body = {"config": config, "pool": "cpu", "hyperopt_trials": 2}
    created = c.request("POST", "/v1/jobs", json=body)
    assert created.status_code == 201 and created.json()["hyperopt_trials"] == 2
    job = c.wait_for(created.json()["id"], timeout=240)
    log = c.request("GET", f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", log[-3000:]
    assert job["step"] == 4 and job["epoch_seconds"] > 0
    assert {"sample", "forward_backward", "adam", "guard"} <= set(job["breakdown_ms"])
    marks = [line.split(" starting: ")[0] for line in log.splitlines() if " starting: " in line]
    started = [mark.removeprefix("--- foxhunt: step ") for mark in marks if mark.startswith("--- foxhunt: step ")]
    trials = ["hyperopt-suggest", "hyperopt-trial 0,1", "hyperopt-best"]
    assert started == ["resolve", "compile", *trials, "train", "report", "on-exit"]
    assert log.count("finished: exit 0 (") == 8 and "Training step breakdown: sample=" in log
    assert "packs: 2 trials in 1 pod(s): 0,1" in log and "trial 1: eval_return_mean=" in log
    assert [(r["run"], r["trial"], r["step"], r["diverged"]) for r in job["runs"]] == [
        (0, 0, 4, False),
        (1, 1, 4, False),
    ]
    assert "train --config " + str(tmp_path / "jobs" / job["id"] / "run" / "hyperopt" / "best-config.json") in log
    job_dir = tmp_path / "jobs" / job["id"]
    assert (job_dir / "run" / "train" / "summary.json").is_file() and any((job_dir / "checkpoints" / "train").iterdir())
    for trial in (0, 1):  # each trial's folder and checkpoint, as a solo trial's
        assert json.loads((job_dir / "run" / "hyperopt" / f"trial-{trial}" / "summary.json").read_text())["packed"]
        assert any((job_dir / "checkpoints" / f"trial-{trial}").iterdir())
    assert json.loads((job_dir / "run" / "status.json").read_text())["status"] == "Succeeded"


def test_a_real_search_of_a_shape_trains_the_trials_that_drew_one_value_as_a_pack_and_the_other_alone(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """The job's own space searches model.head_hidden, which a pack's runs cannot vary. With run.seed 0 the study's
    sampler draws head_hidden 16, 8, 16 for trials 0, 1, 2 (Optuna pinned): trials 0 and 2 train as one pack, trial
    1 alone, and the job said so from its submission."""
    c = controller_factory(make_settings(tmp_path, local_command=list(DEFAULT_LOCAL_COMMAND)))
    config = tiny_train_config(steps=4)
    config["run"]["cpu_threads"] = 1
    config["search"] = {
        "space": {
            "model.head_hidden": {"type": "categorical", "choices": [8, 16]},
            "optim.lr": {"type": "float", "low": 1e-4, "high": 1e-3, "log": True},
        }
    }
    created = c.request("POST", "/v1/jobs", json={"config": config, "pool": "cpu", "hyperopt_trials": 3})
    assert created.status_code == 201, created.text
    assert created.json()["message"].startswith("the search space varies model.head_hidden, which the runs of a pack")
    job = c.wait_for(created.json()["id"], timeout=300)
    log = c.request("GET", f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", log[-3000:]
    marks = [line.split(" starting: ")[0] for line in log.splitlines() if " starting: " in line]
    started = [mark.removeprefix("--- foxhunt: step ") for mark in marks if mark.startswith("--- foxhunt: step ")]
    assert started[2:5] == ["hyperopt-suggest", "hyperopt-trial 0,2", "hyperopt-trial 1"]
    assert "trial 0: model.head_hidden=16 " in log and "trial 1: model.head_hidden=8 " in log
    assert "1 of 3 trials run one per pod" in log and "packs: 3 trials in 2 pod(s): 0,2 1" in log
    hyperopt = tmp_path / "jobs" / job["id"] / "run" / "hyperopt"
    best = json.loads((hyperopt / "best-config.json").read_text())
    assert best["model"]["head_hidden"] in (8, 16) and best["search"]["space"]["model.head_hidden"]["choices"] == [
        8,
        16,
    ]
    packed = {
        trial: json.loads((hyperopt / f"trial-{trial}" / "summary.json").read_text()).get("packed")
        for trial in range(3)
    }
    assert packed == {0: True, 1: None, 2: True}, packed


def test_a_job_given_in_epochs_trains_epochs_times_2000_steps_with_the_real_trainer(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """`epochs` reaches the trainer's resolve step (`--train-epochs`), which writes the config train runs.
    Two epochs: one would be run.steps' default, 2000, and could not tell a conversion from none."""
    c = controller_factory(make_settings(tmp_path, local_command=list(DEFAULT_LOCAL_COMMAND)))
    config = tiny_train_config()
    del config["run"]["steps"]  # the epochs set it
    config["run"] |= {"cpu_threads": 1, "log_every": 1000, "checkpoint_every": 1000}
    # An epoch is 2000 updates: the C51 head alone keeps them to a few milliseconds each on a CPU.
    config["loss"] = {"cql": False, "iqn": False, "iql": False, "attention": False}
    config["optim"] = {"spectral_norm": False}
    created = c.request("POST", "/v1/jobs", json={"config": config, "pool": "cpu", "epochs": 2})
    assert created.status_code == 201, created.text
    job = c.wait_for(created.json()["id"], timeout=240)
    log = c.request("GET", f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", log[-3000:]
    assert job["step"] == 4000 and job["epochs"] == 2
    assert "--model dqn --train-epochs 2 --pool cpu --pools-file " in log
    run = tmp_path / "jobs" / job["id"] / "run"
    assert json.loads((run / "config.json").read_text())["run"]["steps"] == 4000  # resolve's resolved config
    assert json.loads((run / "train" / "summary.json").read_text())["step"] == 4000


def test_logs_of_a_job_the_backend_has_not_seen_yet_are_empty(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, run_reconciler=False))
    job_id = _submit(c).json()["id"]
    response = c.request("GET", f"/v1/jobs/{job_id}/logs")
    assert response.status_code == 200 and response.text == ""


# ---- progress reports from a job's pod ---------------------------------------------------------
PROGRESS_SECRET = "progress-secret-of-the-route-tests-0123456789"


def _progress(c: Controller, job_id: str, body: object, token: str | None = None) -> httpx.Response:
    token = progress_token(PROGRESS_SECRET, job_id) if token is None else token
    return c.client.put(f"/v1/jobs/{job_id}/progress", json=body, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def reporting(
    tmp_path: Path, database_url: str, controller_factory: Callable[[Settings], Controller]
) -> tuple[Controller, str]:
    """A controller that takes progress reports, on each database, and a job on it (no reconciler: it stays QUEUED)."""
    settings = make_settings(tmp_path, database_url=database_url, run_reconciler=False, progress_secret=PROGRESS_SECRET)
    c = controller_factory(settings)
    return c, _submit(c).json()["id"]


def test_a_progress_report_shows_on_the_job_and_survives_statuses_without_figures(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, run_reconciler=False, progress_secret=PROGRESS_SECRET))
    job_id = _submit(c).json()["id"]
    report = {"step": 40, "steps": 100, "plan": "graph", "step_ms": 1.5, "epoch_seconds": 3.0,
              "breakdown_ms": {"sample": 0.25, "fused": 1.25}, "losses": {"c51": None}, "replay_size": 9}  # fmt: skip
    response = _progress(c, job_id, report)
    assert (response.status_code, response.content) == (204, b"")
    job = c.request("GET", f"/v1/jobs/{job_id}").json()
    assert (job["step"], job["epoch_seconds"], job["breakdown_ms"]) == (40, 3.0, {"sample": 0.25, "fused": 1.25})
    assert _progress(c, job_id, {"step": 41}).status_code == 204  # a report without figures keeps them
    c.services.store.apply_status(BackendStatus(job_id=job_id, state=JobState.RUNNING))  # Argo knows none
    job = c.request("GET", f"/v1/jobs/{job_id}").json()
    assert (job["state"], job["step"], job["epoch_seconds"], job["breakdown_ms"]["fused"]) == ("RUNNING", 41, 3.0, 1.25)


def test_progress_reports_need_the_jobs_own_token_and_a_live_job(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    c = controller_factory(make_settings(tmp_path, run_reconciler=False, progress_secret=PROGRESS_SECRET))
    job_id, other = _submit(c, key="a").json()["id"], _submit(c, key="b").json()["id"]
    missing = c.client.put(f"/v1/jobs/{job_id}/progress", json={"step": 1})
    assert (missing.status_code, missing.headers["content-type"]) == (401, PROBLEM)
    cases = {
        "another job's token": (progress_token(PROGRESS_SECRET, other), 403, "not the progress token of job"),
        "a user's token": (c.headers["alice"]["Authorization"].split()[1], 403, "not the progress token of job"),
        "another secret's token": (progress_token("x" * 40, job_id), 403, "not the progress token of job"),
    }
    for what, (token, code, detail) in cases.items():
        response = _progress(c, job_id, {"step": 1}, token)
        assert (response.status_code, response.headers["content-type"]) == (code, PROBLEM), what
        assert detail in response.json()["detail"], what
    assert _progress(c, "job-nope", {"step": 1}).status_code == 404  # a valid token for no stored job
    assert _progress(c, job_id, {"step": -1}).status_code == 422
    assert _progress(c, job_id, {"step": 1, "breakdown_ms": {"sample": -0.5}}).status_code == 422
    assert c.request("DELETE", f"/v1/jobs/{job_id}").json()["state"] == "CANCELLED"  # never submitted
    ended = _progress(c, job_id, {"step": 1})
    assert ended.status_code == 409 and "takes no more progress reports" in ended.json()["detail"]
    assert c.request("GET", f"/v1/jobs/{job_id}").json()["step"] is None


def test_progress_reports_take_strict_types(reporting: tuple[Controller, str]) -> None:
    """A string, a boolean or a float is not a step, a string is not a figure: 422, nothing stored."""
    c, job_id = reporting
    coerced: list[dict[str, object]] = [
        {"step": "5"},
        {"step": True},
        {"step": 5.0},
        {"step": 1, "steps": "9"},
        {"step": 1, "breakdown_ms": {"sample": "1"}},
        {"step": 1, "breakdown_ms": {"sample": True}},
        {"step": 1, "epoch_seconds": "3.0"},
        {"step": 1, "step_ms": False},
        {"step": 1, "losses": {"c51": "0.5"}},
        {"step": 1, "plan": 7},
    ]
    for body in coerced:
        response = _progress(c, job_id, body)
        assert (response.status_code, response.headers["content-type"]) == (422, PROBLEM), body
    assert c.request("GET", f"/v1/jobs/{job_id}").json()["step"] is None
    assert _progress(c, job_id, {"step": 7, "epoch_seconds": 3, "breakdown_ms": {"sample": 1}}).status_code == 204
    job = c.request("GET", f"/v1/jobs/{job_id}").json()  # a JSON integer is a number: 3 is 3.0
    assert (job["step"], job["epoch_seconds"], job["breakdown_ms"]) == (7, 3.0, {"sample": 1.0})


def test_a_retry_gets_a_new_progress_token_and_the_previous_attempts_is_refused(
    reporting: tuple[Controller, str],
) -> None:
    c, job_id = reporting
    first = progress_token(PROGRESS_SECRET, job_id, 0)
    assert _progress(c, job_id, {"step": 5}, first).status_code == 204
    assert _progress(c, job_id, {"step": 5}, progress_token(PROGRESS_SECRET, job_id, 1)).status_code == 403  # not yet
    assert c.request("DELETE", f"/v1/jobs/{job_id}").json()["state"] == "CANCELLED"
    assert c.request("POST", f"/v1/jobs/{job_id}/retry").json()["attempt"] == 1
    second = progress_token(PROGRESS_SECRET, job_id, 1)
    assert second != first
    stale = _progress(c, job_id, {"step": 99}, first)  # the first attempt's trainer, still stopping
    assert (stale.status_code, stale.headers["content-type"]) == (403, PROBLEM)
    assert "attempt 0" in stale.json()["detail"] and "attempt 1" in stale.json()["detail"]
    assert c.request("GET", f"/v1/jobs/{job_id}").json()["step"] == 5  # its figures did not land
    assert _progress(c, job_id, {"step": 1}, second).status_code == 204
    assert c.request("GET", f"/v1/jobs/{job_id}").json()["step"] == 1
    forged = f"1.{first.partition('.')[2]}"  # attempt 0's digest relabelled as attempt 1
    assert _progress(c, job_id, {"step": 2}, forged).status_code == 403


def test_without_a_progress_secret_no_report_is_taken(controller: Controller) -> None:
    job_id = _submit(controller).json()["id"]
    response = _progress(controller, job_id, {"step": 1})
    assert response.status_code == 403 and "FOXHUNT_PROGRESS_SECRET is not set" in response.json()["detail"]


RUNS = [
    {"run": 0, "seed": 3, "trial": 0, "step": 40, "train_return": 12.5, "eval_return": None, "diverged": False},
    {"run": 1, "seed": 3, "trial": 1, "step": 20, "train_return": None, "eval_return": 9, "diverged": True},
]


def test_a_packs_per_run_progress_shows_on_the_job_and_a_report_without_it_keeps_it(
    reporting: tuple[Controller, str],
) -> None:
    c, job_id = reporting
    assert c.request("GET", f"/v1/jobs/{job_id}").json()["runs"] is None  # no pack reported yet
    assert _progress(c, job_id, {"step": 40, "runs": RUNS}).status_code == 204
    job = c.request("GET", f"/v1/jobs/{job_id}").json()
    assert job["runs"] == [RUNS[0], {**RUNS[1], "eval_return": 9.0}]
    assert _progress(c, job_id, {"step": 41}).status_code == 204  # a solo report keeps the pack's runs
    assert c.request("GET", f"/v1/jobs/{job_id}").json()["runs"][1]["diverged"] is True
    listed = c.request("GET", "/v1/jobs").json()["items"]
    assert "runs" not in listed[0]  # up to 64 entries a job: the job's own GET shows them, not every list page


def test_per_run_entries_take_strict_types_and_stay_bounded(reporting: tuple[Controller, str]) -> None:
    c, job_id = reporting
    entry = RUNS[0]
    bad: list[object] = [
        [{**entry, "step": "5"}],
        [{**entry, "step": -1}],
        [{**entry, "diverged": 1}],
        [{**entry, "run": 64}],
        [{**entry, "run": True}],
        [{**entry, "seed": -1}],
        [{**entry, "eval_return": "1.5"}],
        [{k: v for k, v in entry.items() if k != "step"}],
        [entry, {**RUNS[1], "run": 0}],  # one index twice
        [{**entry, "run": i} for i in range(64)] + [{**entry, "run": 0}],  # 65 entries
        {"0": entry},
    ]
    for runs in bad:
        response = _progress(c, job_id, {"step": 1, "runs": runs})
        assert (response.status_code, response.headers["content-type"]) == (422, PROBLEM), runs
    job = c.request("GET", f"/v1/jobs/{job_id}").json()
    assert (job["step"], job["runs"]) == (None, None)
    full = [{**entry, "run": i} for i in range(64)]
    assert _progress(c, job_id, {"step": 1, "runs": full}).status_code == 204
    assert len(c.request("GET", f"/v1/jobs/{job_id}").json()["runs"]) == 64


def test_a_real_packs_reports_show_each_run_on_the_job(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """`trainer train-pack` with what a pod gets (the controller's URL, the job and its progress token) sends its
    pack reports, and the job's GET shows each seed's run: index, seed, the step it reached, no divergence.
    SQLite only: the store's part is the route tests' above, on both databases."""
    c = controller_factory(make_settings(tmp_path, run_reconciler=False, progress_secret=PROGRESS_SECRET))
    job_id = _submit(c).json()["id"]
    config = tmp_path / "pack.json"
    config.write_text(json.dumps(tiny_train_config(steps=4)))
    with live_server(c.app) as url:
        env = {**os.environ, "FOXHUNT_PROGRESS_URL": url, "FOXHUNT_JOB_ID": job_id}
        env |= {"FOXHUNT_PROGRESS_TOKEN": progress_token(PROGRESS_SECRET, job_id)}
        env.pop("FOXHUNT_METRICS_PORT", None)
        env.pop("FOXHUNT_CHECKPOINT_URL", None)
        command = [sys.executable, "-m", "trainer", "train-pack", "--config", str(config), "--seeds", "5,6"]
        done = subprocess.run([*command, "--out", str(tmp_path / "pack")], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    job = c.request("GET", f"/v1/jobs/{job_id}").json()  # the reporter sends its last report before the exit
    assert [(r["run"], r["seed"], r["trial"], r["step"], r["diverged"]) for r in job["runs"]] == [
        (0, 5, None, 4, False), (1, 6, None, 4, False),
    ]  # fmt: skip
    assert job["step"] == 4 and all(isinstance(r["eval_return"], float) for r in job["runs"])  # the final evaluation
