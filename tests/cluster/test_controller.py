"""The controller's Argo backend against the real API server and Argo controller: submit, status,
idempotent resubmit, logs, cancel and a retry that resumes from the checkpoint, two replicas of which
only the Lease holder reconciles, and the RBAC of k8s/base.

Stage 1: the pods' commands run as processes of this machine (tests/cluster/pods.py); the log lines the
controller follows are what those processes print, served through kwok's kubelet API.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from kubernetes import client

from service.app import create_app
from service.leader import LeaderElector
from tests.cluster.conftest import NAMESPACE, Cluster, Controller, controller_settings, workflow
from tests.cluster.pods import PodRunner
from tests.polling import wait_until
from tests.service.conftest import Controller as ServiceController
from tests.service.factories import tiny_train_config

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

POOL = "ci-training-h100"
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
CONTROLLER = f"system:serviceaccount:{NAMESPACE}:foxhunt-controller"
WORKFLOW_SA = f"system:serviceaccount:{NAMESPACE}:foxhunt-workflow"


def test_resubmitting_the_same_job_returns_it_and_creates_no_second_workflow(
    controller: Controller, foxhunt: Cluster
) -> None:
    body = {"pool": POOL, "config": tiny_train_config(steps=2), "name": "same-twice"}
    first = controller.api.post("/v1/jobs", json=body)
    again = controller.api.post("/v1/jobs", json=body)
    assert first.status_code == 201 and again.status_code in (200, 201), again.text
    assert again.json()["id"] == first.json()["id"]

    # The reconciler's submit pass hands the job to Argo after the POST returns: wait for its workflow, then
    # for the job to record the hand-over, and only then count the workflows.
    def labelled() -> list[str]:
        return foxhunt.kubectl("get", "workflows", "-n", NAMESPACE, "-l", f"foxhunt.io/job-id={first.json()['id']}",
                               "-o", "name").stdout.split()  # fmt: skip

    wait_until(labelled, 60, interval=0.5, what="the job's workflow")
    wait_until(lambda: controller.job(first.json()["id"])["state"] != "QUEUED", 60, what="the hand-over recorded")
    assert labelled() == [f"workflow.argoproj.io/{first.json()['id']}"]
    # Accepted by Argo under `templateReferencing: Strict` (a Workflow with templates of its own is not)
    wait_until(lambda: workflow(foxhunt, first.json()["id"]).get("status", {}).get("phase"), 60, what="a phase")
    controller.api.delete(f"/v1/jobs/{first.json()['id']}")


def test_follow_logs_cancel_then_retry_resumes_from_the_checkpoint(
    controller: Controller, pods: PodRunner, foxhunt: Cluster
) -> None:
    created = controller.api.post("/v1/jobs", json={"pool": POOL, "config": tiny_train_config(steps=1_000_000)})
    job_id = created.json()["id"]
    wait_until(lambda: (controller.job(job_id)["step"] or 0) > 20, 600, interval=0.5, what="training progress")
    assert controller.job(job_id)["state"] == "RUNNING"

    lines: list[str] = []

    def follow() -> None:
        with controller.api.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"}, timeout=None) as r:
            for line in r.iter_lines():
                lines.append(line)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    wait_until(lambda: any("Training step breakdown" in line for line in lines), 120, what="followed log lines")

    assert controller.api.delete(f"/v1/jobs/{job_id}").status_code == 202
    cancelled = controller.wait_for(job_id, ENDED, timeout=300)
    assert cancelled["state"] == "CANCELLED", cancelled
    argo = workflow(foxhunt, job_id)
    assert argo["spec"]["shutdown"] == "Stop"
    train = next(run for run in pods.runs if run.workflow == job_id and run.template == "train")
    assert train.exit_code == 143  # SIGTERM: the trainer wrote a checkpoint and exited
    stopped_at = int(re.findall(r"terminated at step (\d+): checkpoint written", train.log.read_text())[-1])
    assert "on-exit" in pods.steps(job_id)  # the exit handler ran on stop
    follower.join(timeout=120)
    assert not follower.is_alive(), "following the logs must end when the job ends"

    assert controller.api.post(f"/v1/jobs/{job_id}/retry").status_code == 202
    retry = f"{job_id}-retry-1"
    wait_until(
        lambda: any(r.workflow == retry and r.template == "train" for r in pods.runs) or _train_running(pods, retry),
        600,
        what="the retry's train step",
    )
    wait_until(lambda: (controller.job(job_id)["step"] or 0) > stopped_at, 600, what="the retry's progress")
    assert controller.api.delete(f"/v1/jobs/{job_id}").status_code == 202
    assert controller.wait_for(job_id, ENDED, timeout=300)["attempt"] == 1
    resumed = next(run for run in pods.runs if run.workflow == retry and run.template == "train")
    assert f"resumed from checkpoint at step {stopped_at}" in resumed.log.read_text()


def _train_running(pods: PodRunner, workflow_name: str) -> bool:
    return any(p.name.startswith(workflow_name) and "train" in p.name for p in (pods.root / "pods").glob("*"))


def test_a_step_that_fails_fails_the_job_with_a_message_naming_the_step(
    controller: Controller, pods: PodRunner
) -> None:
    """The trainer's own failure (exit 1) is the job's result: not retried, and the message says where."""
    pods.verdict = lambda pod, template: 1 if template == "train" else None
    created = controller.api.post("/v1/jobs", json={"pool": POOL, "config": tiny_train_config(steps=2)})
    job = controller.wait_for(created.json()["id"], ENDED)
    assert job["state"] == "FAILED", job
    assert "train" in (job["message"] or ""), job
    assert pods.steps(job["id"]).count("train") == 1


def test_a_step_ended_by_sigterm_is_retried_by_the_retry_strategy(controller: Controller, pods: PodRunner) -> None:
    """Exit 143 (preemption, node drain) is an infrastructure failure: Argo runs the step again."""
    ended: list[str] = []

    def first_train_preempted(pod: client.V1Pod, template: str) -> int | None:
        if template == "train" and not ended:
            ended.append(pod.metadata.name)
            return 143
        return None

    pods.verdict = first_train_preempted
    created = controller.api.post("/v1/jobs", json={"pool": POOL, "config": tiny_train_config(steps=2)})
    job = controller.wait_for(created.json()["id"], ENDED, timeout=900)
    assert job["state"] == "SUCCEEDED", job
    assert pods.steps(job["id"]).count("train") == 2


def test_only_the_lease_holder_reconciles_with_a_real_lease(foxhunt: Cluster, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'shared.db'}"
    replicas = [
        ServiceController(
            create_app(
                controller_settings(
                    foxhunt,
                    tmp_path / name,
                    database_url=database,
                    leader_election=True,
                    leader_election_lease_seconds=4,
                    leader_election_renew_deadline_seconds=3,
                    leader_election_retry_seconds=0.5,
                )
            )
        )
        for name in ("a", "b")
    ]
    try:
        leading = wait_until(
            lambda: [r for r in replicas if r.services.reconciler.leading], 60, what="a replica to take the Lease"
        )
        assert len(leading) == 1
        leader, other = leading[0], next(r for r in replicas if r is not leading[0])
        lease = client.CoordinationV1Api(foxhunt.api_client()).read_namespaced_lease("foxhunt-controller", NAMESPACE)
        elector = leader.services.reconciler.leader
        assert isinstance(elector, LeaderElector) and lease.spec.holder_identity == elector.identity

        def passes(replica: ServiceController) -> float:
            registry = replica.services.metrics.registry
            return registry.get_sample_value("foxhunt_reconcile_duration_seconds_count") or 0.0

        seen = passes(leader)
        wait_until(lambda: passes(leader) >= seen + 3, 60, what="three more passes of the leader")
        assert passes(other) == 0 and not other.services.reconciler.leading

        leader.close()  # a graceful stop releases the Lease; the other replica takes it
        wait_until(lambda: other.services.reconciler.leading, 60, what="the other replica to lead")
        lease = client.CoordinationV1Api(foxhunt.api_client()).read_namespaced_lease("foxhunt-controller", NAMESPACE)
        other_elector = other.services.reconciler.leader
        assert isinstance(other_elector, LeaderElector) and lease.spec.holder_identity == other_elector.identity
        assert lease.spec.lease_transitions >= 1
    finally:
        for replica in replicas:
            replica.close()


ALLOWED = {
    CONTROLLER: [
        ("create", "workflows.argoproj.io"), ("get", "workflows.argoproj.io"), ("list", "workflows.argoproj.io"),
        ("watch", "workflows.argoproj.io"), ("patch", "workflows.argoproj.io"),
        ("get", "workflowtemplates.argoproj.io"), ("get", "pods"), ("list", "pods"), ("get", "pods/log"),
        ("get", "leases.coordination.k8s.io"), ("create", "leases.coordination.k8s.io"),
        ("update", "leases.coordination.k8s.io"),
    ],
    WORKFLOW_SA: [("create", "workflowtaskresults.argoproj.io"), ("patch", "workflowtaskresults.argoproj.io")],
}  # fmt: skip
REFUSED = {
    CONTROLLER: [
        ("delete", "workflows.argoproj.io"), ("update", "workflows.argoproj.io"),
        ("create", "workflowtemplates.argoproj.io"), ("create", "pods"), ("delete", "pods"), ("create", "pods/exec"),
        ("get", "secrets"), ("list", "secrets"), ("get", "configmaps"), ("delete", "leases.coordination.k8s.io"),
        ("list", "workflows.argoproj.io --all-namespaces"), ("list", "nodes"),
    ],
    WORKFLOW_SA: [("get", "workflows.argoproj.io"), ("get", "secrets"), ("create", "pods"), ("get", "pods")],
}  # fmt: skip


@pytest.mark.parametrize("account", [CONTROLLER, WORKFLOW_SA], ids=["controller", "workflow"])
def test_rbac_of_k8s_base_allows_what_each_account_needs_and_refuses_the_rest(foxhunt: Cluster, account: str) -> None:
    def can(verb: str, resource: str) -> bool:
        args = ["auth", "can-i", verb, *resource.split(), "--as", account]
        if "--all-namespaces" not in resource:
            args += ["-n", NAMESPACE]
        return foxhunt.kubectl(*args, check=False).stdout.strip() == "yes"

    assert [r for r in ALLOWED[account] if not can(*r)] == []
    assert [r for r in REFUSED[account] if can(*r)] == []
    # and a real call with the account's own token is refused, not only the review
    core = client.CoreV1Api(foxhunt.api_client(token=foxhunt.token(account.rsplit(":", 1)[1])))
    with pytest.raises(client.ApiException) as refused:
        core.list_namespaced_secret(NAMESPACE)
    assert refused.value.status == 403


def test_the_nightly_cron_workflow_is_accepted_and_creates_a_workflow_when_triggered(foxhunt: Cluster) -> None:
    cron = json.loads(
        foxhunt.kubectl("get", "cronworkflow", "foxhunt-bench-nightly", "-n", NAMESPACE, "-o", "json").stdout
    )
    assert cron["spec"]["schedules"] or cron["spec"].get("schedule")
    done = foxhunt.argo("submit", "-n", NAMESPACE, "--from", "cronwf/foxhunt-bench-nightly", "-o", "name")
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip().splitlines()[-1]
    created = workflow(foxhunt, name)
    assert created["metadata"]["labels"]["workflows.argoproj.io/cron-workflow"] == "foxhunt-bench-nightly"
    wait_until(lambda: workflow(foxhunt, name).get("status", {}).get("phase"), 60, what="Argo to take it up")
    foxhunt.kubectl("delete", "workflow", name, "-n", NAMESPACE)
