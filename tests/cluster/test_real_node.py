"""Stage 2: the pods run for real on the cluster's real node, a kubelet on containerd with the trainer
image that scripts/images.sh builds from this checkout and Argo's own argoexec (init, wait, emissary).

So `withParam` fans out the trial list that argoexec read from the suggest step's stdout, the trainer
reports progress from inside its pod, `kubectl logs` reads the container's log through the kubelet,
and an image that is not there is the kubelet's ImagePullBackOff, not something the test wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts.config import STEPS_PER_EPOCH
from tests.cluster.conftest import NAMESPACE, REAL_NODE, Cluster, Controller, workflow
from tests.polling import wait_until
from tests.service.factories import tiny_train_config

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

POOL = "ci-training-h100"  # the real node's pool (scripts/cluster.sh), the one the seed's command names
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
EPOCHS = 2


def _pods(foxhunt: Cluster, workflow_name: str) -> list[dict[str, Any]]:
    selector = f"workflows.argoproj.io/workflow={workflow_name}"
    listed = foxhunt.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json").stdout
    return json.loads(listed)["items"]  # type: ignore[no-any-return]


def _pod_of(foxhunt: Cluster, workflow_name: str, step: str) -> str:
    return next(
        pod["metadata"]["name"]
        for pod in _pods(foxhunt, workflow_name)
        if pod["metadata"]["labels"].get("foxhunt.io/step") == step
    )


def _result(foxhunt: Cluster, pod: str) -> dict[str, Any]:
    """A step's result line, the last JSON line of its `main` container's log (argoexec's emissary adds
    lines of its own after the step's output: "sub-process exited")."""
    lines = foxhunt.kubectl("logs", pod, "-n", NAMESPACE, "-c", "main").stdout.splitlines()
    return json.loads(next(line for line in reversed(lines) if line.startswith("{")))  # type: ignore[no-any-return]


def test_two_trials_packed_by_withparam_from_argoexecs_own_output_train_and_report_in_real_pods(
    real_controller: Controller, real_node: str, foxhunt: Cluster
) -> None:
    created = real_controller.api.post(
        "/v1/jobs",
        json={"pool": POOL, "config": tiny_train_config(steps=12), "hyperopt_trials": 2, "commit_sha": real_node},
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    job = real_controller.wait_for(job_id, ENDED, timeout=1500)
    assert job["state"] == "SUCCEEDED", job
    # Reported by the trainer from inside its pod, over the pods' bridge
    assert job["step"] == 12 and {"sample", "guard"} <= set(job["breakdown_ms"])

    nodes = workflow(foxhunt, job_id)["status"]["nodes"].values()
    suggest = next(node for node in nodes if node.get("templateName") == "hyperopt-suggest")
    suggested = json.loads(suggest["outputs"]["result"])  # what argoexec read from the step's stdout
    packs = [
        parameter["value"]
        for node in nodes
        if node.get("templateName") == "hyperopt-trial" and node.get("type") == "Pod"
        for parameter in node["inputs"]["parameters"]
        if parameter["name"] == "pack"
    ]
    assert packs == suggested == ["0,1"]  # numbers only in the default space: both trials in one pod, one pack
    # the pack's per-run progress, reported from its pod, is kept on the job after train's own reports
    assert [(run["run"], run["trial"]) for run in job["runs"]] == [(0, 0), (1, 1)]

    pods = _pods(foxhunt, job_id)
    assert {pod["spec"]["nodeName"] for pod in pods} == {REAL_NODE}
    assert all(pod["status"]["phase"] == "Succeeded" for pod in pods), [pod["status"]["phase"] for pod in pods]
    assert _result(foxhunt, _pod_of(foxhunt, job_id, "report"))["steps"] == 12

    logs = real_controller.api.get(f"/v1/jobs/{job_id}/logs")
    assert logs.status_code == 200 and "Training step breakdown" in logs.text


def test_the_seeds_deploy_command_trains_train_epochs_epochs_in_real_pods_and_its_measure_command_prints_the_breakdown(
    real_node: str, foxhunt: Cluster, data_dir: Path
) -> None:
    config = tiny_train_config()
    del config["run"]["steps"]  # train-epochs sets the length
    config["run"]["log_every"] = 500
    submitted = foxhunt.argo(
        *("submit", "-n", NAMESPACE, "--from", "workflowtemplate/compile-and-train"),
        *("-p", f"commit-sha={real_node}", "-p", "model=dqn", "-p", f"gpu-pool={POOL}"),
        *("-p", "hyperopt-trials=0", "-p", f"train-epochs={EPOCHS}"),
        *("-p", f"config={json.dumps(config)}"),  # the one addition: a config small enough for a CPU
        *("-o", "name"),
    )
    assert submitted.returncode == 0, submitted.stderr
    name = submitted.stdout.strip().splitlines()[-1]

    def ended() -> str | None:
        phase = workflow(foxhunt, name).get("status", {}).get("phase")
        return phase if phase in {"Succeeded", "Failed", "Error"} else None

    assert wait_until(ended, 1200, interval=2.0, what=f"{name} to end") == "Succeeded", workflow(foxhunt, name)

    assert _result(foxhunt, _pod_of(foxhunt, name, "report"))["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert (data_dir / "runs" / name / "train" / "summary.json").exists()  # written by the pod, on the volume

    train_pod = _pod_of(foxhunt, name, "train")
    measured = foxhunt.measure(train_pod)
    assert measured.returncode == 0, measured.stderr
    assert measured.stdout.startswith("Training step breakdown: sample=")


def test_a_missing_image_fails_the_job_with_a_message_naming_it_and_stops_its_workflow(
    real_controller: Controller, real_node: str, foxhunt: Cluster
) -> None:
    missing = "deadbeef00"  # no foxhunt-trainer image has this tag, and no registry is reachable
    created = real_controller.api.post(
        "/v1/jobs", json={"pool": POOL, "config": tiny_train_config(steps=2), "commit_sha": missing}
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    job = real_controller.wait_for(job_id, ENDED, timeout=300)  # the grace is 20 s (real_controller)
    assert job["state"] == "FAILED", job
    assert f"foxhunt-trainer:{missing}" in job["message"] and "step resolve cannot start" in job["message"], job

    def workflow_ended() -> str | None:
        phase = workflow(foxhunt, job_id).get("status", {}).get("phase")
        return phase if phase in {"Failed", "Error"} else None

    wait_until(workflow_ended, 120, interval=1.0, what=f"Argo to end the terminated Workflow {job_id}")
