"""create_app wiring that the route tests do not reach."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest

from service.app import GC_YOUNG_THRESHOLD, app_from_environment, create_app
from service.backends.local import LocalBackend
from service.settings import Settings
from tests.service.conftest import Controller
from tests.service.factories import make_settings
from tests.service.fake_kube import FakeKube


def test_argo_needs_a_pools_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, backend="argo", pools_file=None, run_reconciler=False)
    backend = LocalBackend(tmp_path / "jobs", command=["true"], gpus=0)  # any backend: pools are checked first
    with pytest.raises(ValueError, match="FOXHUNT_POOLS_FILE is required with the argo backend"):
        create_app(settings, backend=backend)


def test_the_database_is_migrated_at_start(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, run_reconciler=False))
    assert app.state.services.store.list_jobs() == ([], None)


def test_each_worker_process_freezes_what_it_built_before_it_serves(
    served_settings: Settings, gc_restored: None
) -> None:
    """`foxhunt serve --workers N`: each worker's app (uvicorn's factory) leaves the collector as serve does
    (tests/service/test_cli.py)."""
    gc.unfreeze()
    app = app_from_environment()
    assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    app.state.services.store.dispose()


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{server}"}}}}]
users: [{{name: fake, user: {{token: fake}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: foxhunt}}}}]
current-context: fake
"""
    )
    return path


def test_the_argo_backend_runs_jobs_through_the_kubernetes_api_across_a_restart(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    """Settings -> ArgoBackend.from_settings -> the fake API server: one Workflow per job, even after a restart."""
    with FakeKube(namespace="foxhunt") as kube:
        settings = make_settings(
            tmp_path,
            backend="argo",
            kubeconfig=_kubeconfig(tmp_path / "kubeconfig", kube.url),
            argo_namespace="foxhunt",
            progress_secret="progress-secret-of-the-app-test-0123456789",
        )
        first = controller_factory(settings)
        body = {"config": {"run": {"steps": 2}}, "pool": "h200", "labels": {"exp": "argo"}}
        job_id = first.request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": "a"}).json()["id"]
        first.wait_for(job_id, {"PENDING"})
        assert [w["metadata"]["name"] for w in kube.workflows()] == [job_id]
        kube.set_phase(job_id, "Running")
        first.wait_for(job_id, {"RUNNING"})
        first.close()
        second = controller_factory(settings)
        kube.set_phase(job_id, "Succeeded")
        job = second.wait_for(job_id)
        assert job["state"] == "SUCCEEDED" and len(kube.workflows()) == 1
        assert [h["state"] for h in job["history"]] == ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED"]
