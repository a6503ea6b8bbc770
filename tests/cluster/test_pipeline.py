"""`compile-and-train` end to end on the real API server and Argo controller, submitted over REST.

Stage 1: the pods run on kwok's fake nodes, their commands as processes of this machine
(tests/cluster/pods.py), which also writes what argoexec would report; so the trial list that
`withParam` fans out is the suggest step's real stdout, written into a WorkflowTaskResult by the stand-in.
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.conftest import NAMESPACE, Cluster, Controller, workflow
from tests.cluster.pods import PodRunner
from tests.service.factories import tiny_train_config

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]

POOL = "ci-training-h100"
GPU_STEPS = {"compile", "hyperopt-trial", "train"}
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_two_trials_packed_into_one_pod_by_withparam_from_the_stand_in_executors_result_then_train_and_report(
    controller: Controller, pods: PodRunner, foxhunt: Cluster
) -> None:
    created = controller.api.post(
        "/v1/jobs", json={"pool": POOL, "config": tiny_train_config(steps=12), "hyperopt_trials": 2}
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    job = controller.wait_for(job_id, ENDED, timeout=1200)
    assert job["state"] == "SUCCEEDED", job
    assert job["step"] == 12 and {"sample", "guard"} <= set(job["breakdown_ms"])

    steps = pods.steps(job_id)
    assert steps[:3] == ["resolve", "compile", "hyperopt-suggest"], steps
    # The default space searches numbers only: suggest packs both trials, and one pod trains them as one pack.
    assert steps[3:4] == ["hyperopt-trial"], steps
    assert steps[4:] == ["hyperopt-best", "train", "report", "on-exit"], steps
    suggested = json.loads(next(run.stdout for run in pods.runs if run.template == "hyperopt-suggest"))
    packs = [run.argv[run.argv.index("--trials") + 1] for run in pods.runs if run.template == "hyperopt-trial"]
    assert packs == suggested == ["0,1"]

    argo = workflow(foxhunt, job_id)
    assert argo["status"]["phase"] == "Succeeded"
    report = next(run for run in pods.runs if run.template == "report")
    assert json.loads(report.stdout.splitlines()[-1])["steps"] == 12  # the report step's result line

    logs = controller.api.get(f"/v1/jobs/{job_id}/logs")
    assert logs.status_code == 200 and "Training step breakdown" in logs.text


def test_gpu_steps_carry_the_pools_placement_after_pod_spec_patch(
    controller: Controller, pods: PodRunner, foxhunt: Cluster
) -> None:
    """The real Pods, as Argo made them from the template and the controller's pod-spec-patch."""
    created = controller.api.post("/v1/jobs", json={"pool": POOL, "config": tiny_train_config(steps=2)})
    job_id = created.json()["id"]
    assert controller.wait_for(job_id, ENDED)["state"] == "SUCCEEDED"

    listed = json.loads(
        foxhunt.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", f"workflows.argoproj.io/workflow={job_id}", "-o", "json"
        ).stdout
    )["items"]
    by_step = {pod["metadata"]["labels"]["foxhunt.io/step"]: pod for pod in listed}
    assert GPU_STEPS - {"hyperopt-trial"} <= set(by_step)
    pool_tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "foxhunt.io/pool", "operator": "Equal", "value": POOL, "effect": "NoSchedule"},
    ]
    for step, pod in by_step.items():
        spec = pod["spec"]
        main = next(c for c in spec["containers"] if c["name"] == "main")
        if step in GPU_STEPS:
            assert spec["nodeSelector"] == {"foxhunt.io/pool": POOL}, step
            assert [t for t in spec["tolerations"] if "tolerationSeconds" not in t] == pool_tolerations, step
            assert main["resources"]["requests"]["nvidia.com/gpu"] == "8", step
            assert main["resources"]["limits"]["nvidia.com/gpu"] == "8", step
            assert spec["nodeName"].startswith(f"fake-{POOL}-"), spec["nodeName"]
        else:
            assert "nvidia.com/gpu" not in main["resources"].get("requests", {}), step
        assert pod["metadata"]["labels"]["foxhunt.io/pool"] == POOL
