"""The Argo backend through the real `kubernetes` client against an HTTP-level fake API server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.auth import create_token
from service.backends.argo import (
    FAILURE_ANNOTATION,
    ArgoBackend,
    _shut_down,
    pod_spec_patch,
    status_from_workflow,
    workflow_manifest,
)
from service.backends.argo_parameters import PARAMETER_NAMES, workflow_parameters
from service.backends.base import BackendError, BackendNotFound, BackendUnavailable
from service.domain import BackendStatus, JobSpec, JobState, Placement
from service.progress import progress_token
from service.settings import Settings
from tests.polling import wait_until
from tests.service.backends.conftest import PROGRESS_SECRET, argo_backend, kube_client
from tests.service.factories import job_spec, live_server, make_settings, tiny_train_config
from tests.service.fake_kube import FakeKube

WORKFLOWS = "/apis/argoproj.io/v1alpha1/namespaces/foxhunt/workflows"


def manifest(spec: JobSpec, **kwargs: str) -> dict[str, object]:
    return workflow_manifest(spec, progress_secret=PROGRESS_SECRET, **kwargs)


def parameters(workflow: dict[str, object]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in workflow["spec"]["arguments"]["parameters"]}  # type: ignore[index]


def in_background(*steps: Callable[[], object], delay: float = 0.1) -> threading.Thread:
    """Run `steps` in order on another thread, `delay` apart: the cluster moving while we watch."""

    def run() -> None:
        for step in steps:
            time.sleep(delay)
            step()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def watch_opened(fake_kube: FakeKube, timeout: float = 30.0) -> Callable[[], None]:
    """A background step that waits until the client's watch stream is open (after its initial list),
    so the cluster's changes that follow are ones the watch has to see, however slow the machine."""

    def wait() -> None:
        wait_until(fake_kube.watch_requests, timeout, 0.01, what="the client to open a watch")

    return wait


def until(statuses: Iterator[BackendStatus], done: Callable[[BackendStatus], bool]) -> list[BackendStatus]:
    """Consume a watch until `done` (the generator is then closed, ending its HTTP stream)."""
    seen: list[BackendStatus] = []
    for status in statuses:
        seen.append(status)
        if done(status):
            break
    return seen


# ---- the Workflow we send ----------------------------------------------------------------------
def test_parameters_are_the_declared_names_as_strings() -> None:
    params = workflow_parameters(
        job_spec(epochs=7, hyperopt_trials=4, queue_name=None), pod_spec_patch='{"a":1}', progress_token="t0k"
    )
    assert tuple(p["name"] for p in params) == PARAMETER_NAMES
    values = {p["name"]: p["value"] for p in params}
    assert all(isinstance(v, str) for v in values.values())
    assert values["hyperopt-trials"] == "4" and values["queue-name"] == "" and values["job-id"] == "job-1"
    assert (values["pod-spec-patch"], values["progress-token"]) == ('{"a":1}', "t0k")
    assert json.loads(values["config"]) == {"run": {"steps": 100}, "lr": 0.001}
    assert " " not in values["config"]  # compact JSON
    assert values["model"] == "c51" and values["train-epochs"] == "0"  # the config carries the steps
    assert "plan" not in values and "epochs" not in values  # the config alone carries the plan


def test_a_job_given_in_epochs_passes_them_for_compile_to_turn_into_steps() -> None:
    spec = job_spec(epochs=7, train_epochs=7, config={"run": {"seed": 1}})
    values = {p["name"]: p["value"] for p in workflow_parameters(spec, pod_spec_patch="{}", progress_token="t")}
    assert values["train-epochs"] == "7" and json.loads(values["config"]) == {"run": {"seed": 1}}


def test_pod_spec_patch_is_the_pools_placement_on_the_main_container() -> None:
    patch = json.loads(pod_spec_patch(job_spec().placement))
    gpus = {"nvidia.com/gpu": "8"}
    assert patch == {
        "nodeSelector": {"foxhunt.io/pool": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "resources": {"requests": gpus, "limits": gpus}}],
    }
    amd = json.loads(pod_spec_patch(Placement(gpu_resource="amd.com/gpu", gpus=1)))
    assert amd["containers"] == [
        {"name": "main", "resources": {"requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}}}
    ]


def test_pod_spec_patch_makes_the_pools_own_placement_win_over_the_templates() -> None:
    """The template's GPU steps select foxhunt.io/pool=<pool> and tolerate the GPU and pool taints; Argo merges
    the patch over that (strategic merge): nodeSelector by key, so the template's label is deleted (null) when
    the pool does not select on it; tolerations replaced whole, so the pool's full list goes, even empty."""
    other = Placement(
        node_selector={"cloud.google.com/gke-nodepool": "a3"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        gpus=0,
    )
    assert json.loads(pod_spec_patch(other)) == {
        "nodeSelector": {"cloud.google.com/gke-nodepool": "a3", "foxhunt.io/pool": None},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }  # no GPUs: no containers entry
    assert pod_spec_patch(Placement()) == '{"nodeSelector":{"foxhunt.io/pool":null},"tolerations":[]}'
    tainted = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "foxhunt.io/pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
    ]
    patch = json.loads(pod_spec_patch(Placement(node_selector={"foxhunt.io/pool": "h100"}, tolerations=tainted)))
    assert patch["tolerations"] == tainted and patch["nodeSelector"] == {"foxhunt.io/pool": "h100"}


def test_manifest_carries_the_placement_and_the_attempts_progress_token() -> None:
    values = parameters(manifest(job_spec("job-7")))
    assert values["pod-spec-patch"] == pod_spec_patch(job_spec().placement)
    assert (
        values["progress-token"] == progress_token(PROGRESS_SECRET, "job-7") != progress_token(PROGRESS_SECRET, "job-8")
    )
    retried = parameters(manifest(job_spec("job-7", attempt=3)))["progress-token"]
    assert retried == progress_token(PROGRESS_SECRET, "job-7", 3) != values["progress-token"]  # a retry: a new token


def test_manifest_references_the_template_and_passes_parameters_only() -> None:
    body = manifest(job_spec("job-9", attempt=2), template="compile-and-train")
    assert set(body["spec"]) == {"workflowTemplateRef", "arguments"}
    assert body["spec"]["workflowTemplateRef"] == {"name": "compile-and-train"}
    assert body["metadata"]["name"] == "job-9-retry-2"
    assert body["metadata"]["labels"] == {
        "foxhunt.io/job-id": "job-9",
        "foxhunt.io/tenant": "acme",
        "foxhunt.io/pool": "h100",
        "foxhunt.io/attempt": "2",
        "app.kubernetes.io/managed-by": "foxhunt",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"job_id": "Job_1"}, "job id 'Job_1' is not a lowercase RFC 1123 label"),
        ({"tenant": "acme corp"}, "tenant 'acme corp' is not a valid Kubernetes label value"),
        ({"pool": "x" * 64}, "pool"),
        ({"job_id": "job-1\n"}, "job id 'job-1"),  # `$` in a re pattern passes a final newline
        ({"tenant": "team-a\n"}, "tenant 'team-a"),
    ],
)
def test_manifest_refuses_names_kubernetes_would_refuse(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        manifest(job_spec(**overrides))


# ---- the fake enforces the CRD schema ----------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda b: b["spec"].update(resources={"limits": {"nvidia.com/gpu": 1}}), "'resources' was unexpected"),
        (lambda b: b["spec"]["arguments"]["parameters"][0].update(value=3), "3 is not of type 'string'"),
        # Argo v3.7's CRD (cluster/versions.env) has no pattern on parameter names (v4.1's has): drop one instead.
        (lambda b: b["spec"]["arguments"]["parameters"][0].pop("name"), "'name' is a required property"),
        (lambda b: b["spec"].update(shutdown=True), "True is not of type 'string'"),
        (lambda b: b["metadata"].update(name="Job_1"), "RFC 1123 subdomain"),
    ],
)
def test_fake_rejects_workflows_that_break_the_crd_schema(
    fake_kube: FakeKube, change: Callable[[dict[str, object]], None], error: str
) -> None:
    body = manifest(job_spec())
    client.CustomObjectsApi(kube_client(fake_kube)).create_namespaced_custom_object(
        "argoproj.io", "v1alpha1", "foxhunt", "workflows", manifest(job_spec("ours"))
    )  # ours passes
    change(body)
    with pytest.raises(ApiException) as caught:
        client.CustomObjectsApi(kube_client(fake_kube)).create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", "foxhunt", "workflows", body
        )
    assert caught.value.status == 422
    status = json.loads(caught.value.body)
    assert status["kind"] == "Status" and status["reason"] == "Invalid" and error in status["message"]
    assert [w["metadata"]["name"] for w in fake_kube.workflows()] == ["ours"]


def test_fake_refuses_strategic_merge_patch_on_a_custom_resource(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    api = client.CustomObjectsApi(kube_client(fake_kube))
    with pytest.raises(ApiException) as caught:
        api.patch_namespaced_custom_object(
            "argoproj.io", "v1alpha1", "foxhunt", "workflows", "job-1", {"spec": {"shutdown": "Stop"}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
    assert caught.value.status == 415


# ---- submit ------------------------------------------------------------------------------------
def test_submit_creates_one_pending_workflow(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    status = argo.submit(job_spec())
    assert (status.job_id, status.state, status.reason, status.phase, status.attempt) == (
        "job-1", JobState.PENDING, "Created", "", 0,
    )  # fmt: skip
    (workflow,) = fake_kube.workflows()
    assert workflow["spec"]["arguments"] == manifest(job_spec())["spec"]["arguments"]  # type: ignore[index]


def test_submit_again_reads_the_existing_workflow_back(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    again = argo.submit(job_spec())
    assert again.state is JobState.RUNNING  # the existing job's status, not a new one
    assert len(fake_kube.workflows()) == 1
    calls = [(m, p) for m, p, _ in fake_kube.requests]
    assert calls[-2:] == [("POST", WORKFLOWS), ("GET", f"{WORKFLOWS}/job-1")]


def test_submit_whose_answer_was_lost_is_not_duplicated(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    fake_kube.commit_then_drop(1)  # created, but the client never hears so and retries
    status = argo.submit(job_spec())
    assert status.job_id == "job-1" and len(fake_kube.workflows()) == 1
    assert argo.retries["connection"] == 1


def test_submit_refuses_a_name_held_by_another_job(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    body = manifest(job_spec("job-2"))
    body["metadata"]["name"] = "job-1"  # type: ignore[index]
    fake_kube.state.create("workflows", "foxhunt", body)
    with pytest.raises(BackendError, match="Workflow job-1 exists but belongs to job 'job-2'"):
        argo.submit(job_spec("job-1"))


def test_retry_is_a_new_workflow_and_becomes_the_jobs_status(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Failed", "exit code 1")
    retried = argo.submit(job_spec(attempt=1))
    assert (retried.state, retried.attempt) == (JobState.PENDING, 1)
    assert sorted(w["metadata"]["name"] for w in fake_kube.workflows()) == ["job-1", "job-1-retry-1"]
    fake_kube.set_phase("job-1-retry-1", "Running")
    assert (argo.status("job-1").state, argo.status("job-1").attempt) == (JobState.RUNNING, 1)
    assert [(s.job_id, s.attempt) for s in argo.list_statuses()] == [("job-1", 1)]


# ---- status ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("phase", "message", "failed_step", "state", "reason", "shown"),
    [
        (None, None, None, JobState.PENDING, "Created", None),
        ("Pending", None, None, JobState.PENDING, None, None),
        ("Running", None, None, JobState.RUNNING, None, None),
        ("Succeeded", None, None, JobState.SUCCEEDED, None, None),
        # A step's failure as a real Argo reports it: the reason on the pod's node, not the workflow
        ("Failed", None, ("train", "Error (exit code 1)"), JobState.FAILED, "JobFailed",
         "step train failed: Error (exit code 1)"),
        ("Failed", None, ("train", "OOMKilled (exit code 137)"), JobState.FAILED, "OOMKilled",
         "step train failed: OOMKilled (exit code 137)"),
        ("Failed", "Step exceeded its deadline", None, JobState.FAILED, "DeadlineExceeded",
         "Step exceeded its deadline"),
        ("Error", None, ("compile", "pod deleted"), JobState.ERROR, "InfrastructureError",
         "step compile failed: pod deleted"),
    ],
)  # fmt: skip
def test_status_maps_every_phase(
    fake_kube: FakeKube,
    argo: ArgoBackend,
    phase: str | None,
    message: str | None,
    failed_step: tuple[str, str] | None,
    state: JobState,
    reason: str,
    shown: str | None,
) -> None:
    argo.submit(job_spec())
    if phase is not None:
        fake_kube.set_phase("job-1", phase, message, failed_step=failed_step)
    status = argo.status("job-1")
    assert (status.state, status.reason, status.message) == (state, reason, shown)
    assert status.phase == (phase or "")
    assert (status.started_at is not None) == (phase is not None)
    assert (status.finished_at is not None) == (phase in ("Succeeded", "Failed", "Error"))


@pytest.mark.parametrize(
    ("shutdown", "phase", "state", "reason"),
    [
        ("Stop", "Running", JobState.RUNNING, None),  # stopping: exit handlers still run
        ("Stop", "Failed", JobState.CANCELLED, "Stopped"),
        ("Terminate", "Failed", JobState.CANCELLED, "Terminated"),
        ("Terminate", "Error", JobState.CANCELLED, "Terminated"),
        ("Stop", "Succeeded", JobState.SUCCEEDED, None),  # it finished before the stop took effect
    ],
)
def test_status_of_a_shut_down_workflow(
    fake_kube: FakeKube, argo: ArgoBackend, shutdown: str, phase: str, state: JobState, reason: str | None
) -> None:
    argo.submit(job_spec())
    fake_kube.update_workflow("job-1", lambda w: w["spec"].update(shutdown=shutdown))
    fake_kube.set_phase("job-1", phase, f"Stopped with strategy '{shutdown}'")
    assert (argo.status("job-1").state, argo.status("job-1").reason) == (state, reason)


PULL_BACKOFF = 'ImagePullBackOff: Back-off pulling image "foxhunt-trainer:deadbeef00"'


def _at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_step_waiting_for_an_image_within_the_grace_is_running(fake_kube: FakeKube) -> None:
    argo = argo_backend(fake_kube, image_pull_grace_seconds=60.0)
    argo.submit(job_spec())
    fake_kube.wait_for_image("job-1", "resolve", PULL_BACKOFF, started=_at(time.time() - 30))
    assert argo.status("job-1").state is JobState.RUNNING
    assert "shutdown" not in fake_kube.workflow("job-1")["spec"]


def test_a_step_whose_image_cannot_be_pulled_fails_the_job_and_terminates_its_workflow(fake_kube: FakeKube) -> None:
    argo = argo_backend(fake_kube, image_pull_grace_seconds=60.0)
    argo.submit(job_spec())
    fake_kube.wait_for_image("job-1", "resolve", PULL_BACKOFF, started=_at(time.time() - 61))

    [status] = argo.list_statuses()  # the reconciler's pass
    assert (status.state, status.reason) == (JobState.FAILED, "ImagePullFailed")
    assert status.message == f"step resolve cannot start: {PULL_BACKOFF}"  # names the step and the image
    obj = fake_kube.workflow("job-1")
    assert obj["spec"]["shutdown"] == "Terminate"  # its pods stop waiting
    assert obj["metadata"]["annotations"][FAILURE_ANNOTATION] == status.message
    # Argo then ends the terminated Workflow as it ends a cancelled one; the verdict stands.
    fake_kube.set_phase("job-1", "Failed", "Stopped with strategy 'Terminate'")
    assert argo.status("job-1").state is JobState.FAILED and argo.status("job-1").reason == "ImagePullFailed"


def test_unknown_phase_is_pending_not_a_failure() -> None:
    status = status_from_workflow({"metadata": {"name": "a"}, "status": {"phase": "Paused"}})
    assert (status.state, status.reason, status.job_id) == (JobState.PENDING, "UnknownPhase", "a")


def test_unknown_job_is_not_found(argo: ArgoBackend) -> None:
    with pytest.raises(BackendNotFound):
        argo.status("nope")
    with pytest.raises(BackendNotFound):
        argo.cancel("nope")
    with pytest.raises(BackendNotFound):
        list(argo.logs("nope"))
    with pytest.raises(BackendNotFound):
        argo.status("Not A Label")


# ---- cancel ------------------------------------------------------------------------------------
def test_cancel_stops_gracefully_then_force_terminates(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    argo.cancel("job-1")
    assert fake_kube.workflow("job-1")["spec"]["shutdown"] == "Stop"
    argo.cancel("job-1")  # a second graceful cancel changes nothing
    assert [m for m, _, _ in fake_kube.requests].count("PATCH") == 1
    argo.cancel("job-1", force=True)
    assert fake_kube.workflow("job-1")["spec"]["shutdown"] == "Terminate"
    argo.cancel("job-1")  # never downgrades a terminate
    assert fake_kube.workflow("job-1")["spec"]["shutdown"] == "Terminate"
    assert fake_kube.workflow("job-1")["spec"]["workflowTemplateRef"] == {"name": "compile-and-train"}  # merged


def test_cancel_of_an_ended_job_changes_nothing(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Failed", "exit code 1")
    argo.cancel("job-1", force=True)
    assert "shutdown" not in fake_kube.workflow("job-1")["spec"]
    assert argo.status("job-1").state is JobState.FAILED


# ---- watch -------------------------------------------------------------------------------------
def test_watch_yields_changes_not_the_baseline(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec("old"))
    argo.submit(job_spec())
    in_background(
        lambda: fake_kube.set_phase("job-1", "Running"),
        lambda: fake_kube.update_workflow("job-1", lambda w: w["status"].update(nodes={})),  # same status
        lambda: fake_kube.set_phase("job-1", "Succeeded"),
    )
    seen = until(argo.watch(timeout_seconds=10), lambda s: s.state.terminal)
    assert [(s.job_id, s.state) for s in seen] == [("job-1", JobState.RUNNING), ("job-1", JobState.SUCCEEDED)]


def test_watch_resumes_from_a_bookmark(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    in_background(
        watch_opened(fake_kube),
        lambda: fake_kube.add_pod("job-1", "job-1-train"),  # moves the resourceVersion, not our objects
        fake_kube.request_bookmark,
        fake_kube.compact,  # history before the bookmark is gone: resuming from older would be 410
        fake_kube.end_watches,
        lambda: fake_kube.set_phase("job-1", "Running"),
    )
    seen = until(argo.watch(timeout_seconds=10), lambda s: s.state is JobState.RUNNING)
    assert [s.state for s in seen] == [JobState.RUNNING]
    first, second = fake_kube.watch_requests()[:2]
    pod_rv = fake_kube.state.get("pods", "foxhunt", "job-1-train")["metadata"]["resourceVersion"]
    assert first["allowWatchBookmarks"] == "true" and second["resourceVersion"] == pod_rv
    assert argo.relists == 1  # no relist was needed


def test_watch_relists_after_410_gone_and_reports_what_it_missed(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    argo.submit(job_spec("job-2"))

    def miss_events() -> None:
        fake_kube.pause_watches()  # the stream stalls...
        fake_kube.set_phase("job-1", "Succeeded")
        fake_kube.add_pod("job-2", "job-2-train")
        fake_kube.compact()  # ...while its resume point is compacted away
        fake_kube.pause_watches(False)

    in_background(watch_opened(fake_kube), lambda: fake_kube.set_phase("job-2", "Running"), miss_events)
    seen = until(argo.watch(timeout_seconds=10), lambda s: s.job_id == "job-1")
    assert [(s.job_id, s.state) for s in seen] == [("job-2", JobState.RUNNING), ("job-1", JobState.SUCCEEDED)]
    assert argo.relists == 2


def test_watch_rides_out_transient_errors(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())

    def break_the_stream() -> None:
        fake_kube.fail_next(2, 503)
        fake_kube.drop_next(1)
        fake_kube.end_watches()

    in_background(break_the_stream, lambda: fake_kube.set_phase("job-1", "Running"), delay=0.2)
    seen = until(argo.watch(timeout_seconds=10), lambda s: s.state is JobState.RUNNING)
    assert [s.state for s in seen] == [JobState.RUNNING]
    assert argo.retries == {"server_error": 2, "connection": 1}


def test_watch_gives_up_after_the_bound(fake_kube: FakeKube) -> None:
    argo = argo_backend(fake_kube, max_attempts=3)
    fake_kube.fail_next(5, 500)
    with pytest.raises(BackendUnavailable, match="after 3 attempts"):
        list(argo.watch(timeout_seconds=5))


def test_watch_ends_after_its_timeout(argo: ArgoBackend) -> None:
    started = time.monotonic()
    assert list(argo.watch(timeout_seconds=1)) == []
    assert time.monotonic() - started < 4


# ---- transient errors --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("inject", "cause"),
    [
        (lambda f: f.fail_next(3, 503), "server_error"),
        (lambda f: f.fail_next(3, 500), "server_error"),
        (lambda f: f.fail_next(3, 429), "throttled"),
        (lambda f: f.drop_next(3), "connection"),
    ],
)
def test_transient_errors_are_retried_and_counted(
    fake_kube: FakeKube, argo: ArgoBackend, inject: Callable[[FakeKube], None], cause: str
) -> None:
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    inject(fake_kube)
    assert argo.status("job-1").state is JobState.RUNNING
    assert argo.retries == {cause: 3}


def test_persistent_errors_raise_unavailable_never_a_job_failure(fake_kube: FakeKube) -> None:
    argo = argo_backend(fake_kube, max_attempts=3)
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    fake_kube.fail_next(3, 502)
    with pytest.raises(BackendUnavailable, match="after 3 attempts"):
        argo.status("job-1")
    fake_kube.fail_next(3, 503)
    with pytest.raises(BackendUnavailable):
        argo.submit(job_spec("job-2"))
    assert argo.status("job-1").state is JobState.RUNNING
    assert [w["metadata"]["name"] for w in fake_kube.workflows()] == ["job-1"]
    assert argo.retries == {"server_error": 6}


def test_other_api_errors_are_backend_errors_without_retry(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    fake_kube.fail_next(1, 403)
    with pytest.raises(BackendError, match="403 injected fault") as caught:
        argo.status("job-1")
    assert not isinstance(caught.value, BackendUnavailable | BackendNotFound)
    assert not argo.retries


def test_unreachable_server_is_unavailable(fake_kube: FakeKube) -> None:
    configuration = client.Configuration(host="http://127.0.0.1:9")  # nothing listens on discard
    configuration.retries = 0
    argo = ArgoBackend(
        "foxhunt",
        client.ApiClient(configuration),
        progress_secret=PROGRESS_SECRET,
        max_attempts=2,
        backoff_seconds=0.001,
    )
    with pytest.raises(BackendUnavailable, match="after 2 attempts \\(connection\\)"):
        argo.status("job-1")
    with pytest.raises(BackendUnavailable, match="not usable"):
        argo.ping()


def test_ping(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.ping()
    assert fake_kube.requests[-1][2] == {"limit": "1"}
    fake_kube.fail_next(1, 500)
    with pytest.raises(BackendUnavailable, match="500"):
        argo.ping()


# ---- logs --------------------------------------------------------------------------------------
def test_logs_of_every_pod_in_order(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    argo.submit(job_spec())
    fake_kube.add_pod("job-1", "job-1-prepare", ("compiling", "plan graph captured"), done=True)
    fake_kube.add_pod("job-1", "job-1-train", ("step 1", "step 2"))
    fake_kube.add_pod("other", "other-train", ("not ours",))
    assert list(argo.logs("job-1")) == ["compiling\n", "plan graph captured\n", "step 1\n", "step 2\n"]
    queries = [q for _, p, q in fake_kube.requests if p.endswith("/log")]
    assert all(q["container"] == "main" for q in queries) and queries[0].get("follow") != "true"


def test_following_leaves_a_finished_pod_whose_stream_stays_open(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    """kwok's kubelet never ends a followed log: a pod seen finished while its stream is quiet is left,
    and the follow ends with the workflow."""
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    fake_kube.add_pod("job-1", "job-1-train", ("step 1",))
    lines = argo.logs("job-1", follow=True)
    assert next(lines) == "step 1\n"
    fake_kube.set_pod_phase("job-1-train", "Succeeded")  # its stream stays open
    fake_kube.set_phase("job-1", "Succeeded")
    assert [line for line in lines if line] == []  # ends, with no line twice


def test_logs_follow_streams_until_the_workflow_ends(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    """Each line read moves the cluster on, so the workflow ends only once lines have streamed: a
    follow that collected the log at the end would see the backstop end it after the first line."""
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    fake_kube.add_pod("job-1", "job-1-prepare", ("compiling",))
    changes_after: dict[str, list[Callable[[], object]]] = {
        "compiling\n": [lambda: fake_kube.append_log("job-1-prepare", "cache warm")],
        "cache warm\n": [
            lambda: fake_kube.finish_pod("job-1-prepare"),
            lambda: fake_kube.add_pod("job-1", "job-1-train", ("step 1",)),
        ],
        "step 1\n": [lambda: fake_kube.append_log("job-1-train", "step 2")],
        "step 2\n": [lambda: fake_kube.finish_pod("job-1-train"), lambda: fake_kube.set_phase("job-1", "Succeeded")],
    }

    def backstop_end() -> None:
        fake_kube.finish_pod("job-1-prepare")
        fake_kube.set_phase("job-1", "Failed")

    backstop = threading.Timer(60, backstop_end)
    backstop.start()
    lines: list[str] = []
    try:
        for line in argo.logs("job-1", follow=True):
            lines.append(line)
            for change in changes_after.get(line, []):
                change()
    finally:
        backstop.cancel()
    assert [line for line in lines if line] == ["compiling\n", "cache warm\n", "step 1\n", "step 2\n"]


def test_following_a_quiet_pod_hands_control_back_and_closing_ends_the_read(
    fake_kube: FakeKube, argo: ArgoBackend
) -> None:
    """A follower whose client went away must not leave a thread blocked in the pod's log stream."""
    argo.submit(job_spec())
    fake_kube.set_phase("job-1", "Running")
    fake_kube.add_pod("job-1", "job-1-train", ("step 1",))
    lines = argo.logs("job-1", follow=True)
    assert next(lines) == "step 1\n"
    assert next(lines) == ""  # nothing written for a poll period: control comes back
    (reader,) = [t for t in threading.enumerate() if t.name == "log:job-1-train"]
    lines.close()
    reader.join(timeout=30)  # a generous bound for a loaded machine: the shut-down socket wakes it at once
    assert not reader.is_alive()


def test_interrupting_a_log_read_that_has_just_ended_is_harmless(fake_kube: FakeKube) -> None:
    """A follower closed as its pod's stream ends: the connection is already back in the pool."""
    fake_kube.add_pod("job-1", "job-1-train", ("step 1",), done=True)
    response = client.CoreV1Api(kube_client(fake_kube)).read_namespaced_pod_log(
        "job-1-train", fake_kube.namespace, container="main", follow=True, _preload_content=False
    )
    assert response.read() == b"step 1\n"
    with pytest.raises(RuntimeError, match="released"):
        response.shutdown()
    _shut_down(response)


# ---- restart -----------------------------------------------------------------------------------
def test_a_new_backend_over_the_same_cluster_lists_every_job(fake_kube: FakeKube, argo: ArgoBackend) -> None:
    for n, phase in enumerate(["Running", "Succeeded", "Failed", None, "Error"]):
        argo.submit(job_spec(f"job-{n}"))
        if phase:
            fake_kube.set_phase(f"job-{n}", phase)
    argo.submit(job_spec("job-2", attempt=1))  # the failed one was retried
    restarted = argo_backend(fake_kube, page_size=2)  # a fresh process: nothing in memory
    statuses = {s.job_id: (s.state, s.attempt) for s in restarted.list_statuses()}
    assert statuses == {
        "job-0": (JobState.RUNNING, 0),
        "job-1": (JobState.SUCCEEDED, 0),
        "job-2": (JobState.PENDING, 1),
        "job-3": (JobState.PENDING, 0),
        "job-4": (JobState.ERROR, 0),
    }
    assert sum(1 for _, p, q in fake_kube.requests if p == WORKFLOWS and "continue" in q) == 2  # paged
    assert restarted.submit(job_spec("job-0")).state is JobState.RUNNING  # resubmission: same job
    assert len(fake_kube.workflows()) == 6


# ---- configuration -----------------------------------------------------------------------------
def test_from_settings_uses_the_kubeconfig(fake_kube: FakeKube, tmp_path: Path) -> None:
    kubeconfig = fake_kube.write_kubeconfig(tmp_path / "config")
    argo = ArgoBackend.from_settings(
        Settings(kubeconfig=kubeconfig, argo_namespace="foxhunt", progress_secret=PROGRESS_SECRET)
    )
    argo.submit(job_spec())
    assert fake_kube.workflow("job-1")["spec"]["workflowTemplateRef"] == {"name": "compile-and-train"}
    token = parameters(fake_kube.workflow("job-1"))["progress-token"]
    assert token == progress_token(PROGRESS_SECRET, "job-1")
    with pytest.raises(BackendError, match="FOXHUNT_PROGRESS_SECRET is required with the argo backend"):
        ArgoBackend.from_settings(Settings(kubeconfig=kubeconfig, progress_secret=None))


def test_from_settings_without_any_cluster_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BackendError, match="cannot load the Kubernetes configuration"):
        ArgoBackend.from_settings(Settings(kubeconfig=None, progress_secret=PROGRESS_SECRET))
    with pytest.raises(BackendError, match="cannot load the Kubernetes configuration"):
        ArgoBackend.from_settings(Settings(kubeconfig=tmp_path / "missing", progress_secret=PROGRESS_SECRET))


# ---- end to end: the controller, the fake cluster and a real trainer process -------------------
def eventually(check: Callable[[], object], what: str, timeout: float = 120.0) -> object:
    """Poll `check` until it returns something truthy (the cluster and the trainer are other processes)."""
    return wait_until(check, timeout, what=what)


class Pod:
    """`trainer train` as the compile-and-train template's train step runs it, with a pod's environment."""

    def __init__(self, workflow: dict[str, object], url: str, root: Path) -> None:
        from contracts.pipeline import TRAIN_STEP

        params = parameters(workflow)
        name = workflow["metadata"]["name"]  # type: ignore[index]
        pod_dir = root / "pods" / name  # a pod's own disk: nothing of it outlives the attempt
        pod_dir.mkdir(parents=True)
        config = pod_dir / "config.json"
        config.write_text(params["config"])
        checkpoints = root / "data" / "checkpoints" / params["job-id"]  # the shared volume, per job
        step = TRAIN_STEP
        values = {"config_file": str(config), "run": str(pod_dir / "run"), "checkpoints": str(checkpoints)}
        env = {
            **os.environ,
            "FOXHUNT_JOB_ID": params["job-id"],
            "FOXHUNT_PROGRESS_URL": url,
            "FOXHUNT_PROGRESS_TOKEN": params["progress-token"],
            "FOXHUNT_CHECKPOINT_URL": (step.checkpoint or "").format(**values),
        }
        env.pop("FOXHUNT_METRICS_PORT", None)
        self.log = pod_dir / "main.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trainer", *step.command(values)], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> str:
        """SIGTERM, as Argo's stop does to a running step: the trainer checkpoints and exits."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)
        return self.text()


def test_end_to_end_placement_progress_cancel_and_retry(fake_kube: FakeKube, tmp_path: Path) -> None:
    """Submit over REST to a controller on the Argo backend; the Workflow carries the pool's placement
    and the resolved config; a real trainer, given what a pod gets, reports progress that shows on the
    job while it runs; cancel stops the Workflow; retry's Workflow resumes from the job's checkpoint."""
    settings = make_settings(
        tmp_path, backend="argo", progress_secret=PROGRESS_SECRET, cancel_grace_seconds=600, leader_election=False
    )
    app = create_app(settings, backend=argo_backend(fake_kube))
    secret, _ = create_token(app.state.services.store, name="alice", tenant="team-a")
    pods: list[Pod] = []
    try:
        with (
            live_server(app) as url,
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as api,
        ):

            def job() -> dict[str, object]:
                return api.get(f"/v1/jobs/{job_id}").json()  # type: ignore[no-any-return]

            def workflow(name: str) -> dict[str, object]:
                return eventually(lambda: {w["metadata"]["name"]: w for w in fake_kube.workflows()}.get(name), name)  # type: ignore[return-value]

            config = tiny_train_config(steps=1_000_000)  # runs until stopped
            created = api.post("/v1/jobs", json={"pool": "h200", "config": config})
            assert created.status_code == 201, created.text
            job_id = created.json()["id"]
            first = workflow(job_id)
            params = parameters(first)
            gpus = {"nvidia.com/gpu": "8"}
            assert json.loads(params["pod-spec-patch"]) == {
                "nodeSelector": {"foxhunt.io/pool": "h200"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "main", "resources": {"requests": gpus, "limits": gpus}}],
            }
            assert json.loads(params["config"]) == job()["config"]
            assert json.loads(params["config"])["run"]["steps"] == 1_000_000
            assert set(params) == set(PARAMETER_NAMES) and "plan" not in params
            assert params["train-epochs"] == "0" and params["model"] == "dqn"  # the config carries the steps

            fake_kube.set_phase(job_id, "Running")
            pods.append(Pod(first, url, tmp_path))
            shown = eventually(lambda: (j := job())["step"] and j["breakdown_ms"] and j, "progress on the job")
            assert pods[0].process.poll() is None, "the trainer must still be running"
            assert shown["state"] == "RUNNING" and shown["epoch_seconds"] > 0  # type: ignore[index]
            assert {"sample", "guard"} <= set(shown["breakdown_ms"])  # type: ignore[index]

            assert api.delete(f"/v1/jobs/{job_id}").status_code == 202
            eventually(lambda: fake_kube.workflow(job_id)["spec"].get("shutdown") == "Stop", "spec.shutdown")
            log = pods[0].stop()
            stopped_at = int(re.findall(r"terminated at step (\d+): checkpoint written", log)[-1])
            fake_kube.set_phase(job_id, "Failed", "Stopped with strategy 'Stop'")
            assert eventually(lambda: (j := job())["state"] == "CANCELLED" and j, "CANCELLED")["reason"] == "Stopped"  # type: ignore[index]

            assert api.post(f"/v1/jobs/{job_id}/retry").status_code == 202
            second = workflow(f"{job_id}-retry-1")
            retried = parameters(second)
            assert {**retried, "progress-token": ""} == {**params, "progress-token": ""}  # same checkpoint location
            assert retried["progress-token"] != params["progress-token"]  # the new attempt's own token
            fake_kube.set_phase(f"{job_id}-retry-1", "Running")
            pods.append(Pod(second, url, tmp_path))
            eventually(lambda: f"resumed from checkpoint at step {stopped_at}" in pods[1].text(), "the resume")
            eventually(lambda: (job()["step"] or 0) > stopped_at, "the new attempt's progress")
            pods[1].stop()
            fake_kube.set_phase(f"{job_id}-retry-1", "Succeeded")
            assert eventually(lambda: (j := job())["state"] == "SUCCEEDED" and j, "SUCCEEDED")["attempt"] == 1  # type: ignore[index]
            for token, code in ((params["progress-token"], 403), (retried["progress-token"], 409)):
                late = httpx.put(  # the first attempt's token is refused; the ended attempt's takes no more
                    f"{url}/v1/jobs/{job_id}/progress", json={"step": 1}, headers={"Authorization": f"Bearer {token}"}
                )
                assert late.status_code == code
    finally:
        for pod in pods:
            if pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()


def test_retry_and_relist_counts_are_exported(fake_kube: FakeKube, tmp_path: Path) -> None:
    argo = argo_backend(fake_kube)
    settings = make_settings(tmp_path, backend="argo", progress_secret=PROGRESS_SECRET, run_reconciler=False)
    with TestClient(create_app(settings, backend=argo)) as api:
        fake_kube.fail_next(2, 503)
        fake_kube.fail_next(1, 429)
        fake_kube.drop_next(1)
        assert argo.list_statuses() == []
        assert list(argo.watch(timeout_seconds=1)) == []  # its first list is a relist
        families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}
    retries = {s.labels["cause"]: s.value for s in families["foxhunt_argo_api_retries"].samples}
    assert retries == {"server_error": 2, "throttled": 1, "connection": 1}
    assert [s.value for s in families["foxhunt_argo_relists"].samples if s.name.endswith("_total")] == [1]
