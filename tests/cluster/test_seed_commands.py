"""The seed's own commands, parameter for parameter, with the `argo` CLI built from Argo's module and
the cluster's kubectl: the deploy command trains `train-epochs` epochs, and the measure command prints
the breakdown line.

Stage 1: the pods' commands run as processes of this machine (tests/cluster/pods.py); `kubectl logs`
reads what they printed through kwok's kubelet API (a `Logs` object per pod written by that stand-in).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.config import STEPS_PER_EPOCH
from tests.cluster.conftest import NAMESPACE, Cluster, workflow
from tests.cluster.pods import PodRunner
from tests.polling import wait_until
from tests.service.factories import tiny_train_config

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

COMMIT = "0123abcd"
EPOCHS = 2  # the seed's 5, made shorter: 2 epochs differ from the config's default length, 1 would not


def _submit(foxhunt: Cluster, *parameters: str) -> str:
    done = foxhunt.argo(
        "submit", "-n", NAMESPACE, "--from", "workflowtemplate/compile-and-train", *parameters, "-o", "name"
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _phase(foxhunt: Cluster, name: str) -> str | None:
    phase = workflow(foxhunt, name).get("status", {}).get("phase")
    return phase if phase in {"Succeeded", "Failed", "Error"} else None


def test_the_seeds_deploy_command_trains_train_epochs_epochs_and_its_measure_command_prints_the_breakdown(
    foxhunt: Cluster, pods: PodRunner, data_dir: Path
) -> None:
    config = tiny_train_config()
    del config["run"]["steps"]  # train-epochs sets the length; a config with run.steps too is refused
    config["run"]["log_every"] = 500
    name = _submit(
        foxhunt,
        *("-p", f"commit-sha={COMMIT}", "-p", "model=dqn", "-p", "gpu-pool=ci-training-h100"),
        *("-p", "hyperopt-trials=0", "-p", f"train-epochs={EPOCHS}"),
        *(
            "-p",
            f"config={json.dumps(config)}",
        ),  # the one addition: a config small enough for a CPU
    )
    assert wait_until(lambda: _phase(foxhunt, name), 900, interval=1.0, what=f"{name} to end") == "Succeeded"

    report = next(run for run in pods.runs if run.workflow == name and run.template == "report")
    assert json.loads(report.stdout.splitlines()[-1])["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert (data_dir / "runs" / name / "train" / "summary.json").exists()  # job-id: the Workflow's name

    train_pod = next(run.pod for run in pods.runs if run.workflow == name and run.template == "train")
    # No pod-spec-patch: the template's own placement, by the gpu-pool's label and taints, with one GPU
    spec = json.loads(foxhunt.kubectl("get", "pod", train_pod, "-n", NAMESPACE, "-o", "json").stdout)["spec"]
    assert spec["nodeSelector"] == {"foxhunt.io/pool": "ci-training-h100"}
    assert {"key": "foxhunt.io/pool", "operator": "Equal", "value": "ci-training-h100", "effect": "NoSchedule"} in (
        spec["tolerations"]
    )
    main = next(c for c in spec["containers"] if c["name"] == "main")
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    measured = foxhunt.measure(train_pod)
    assert measured.returncode == 0, measured.stderr
    assert measured.stdout.startswith("Training step breakdown: sample=")


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (("-p", "model=rainbow"), "model"),
        (("-p", "gpu-pool=no-such-pool"), "ci-training-h100"),  # the message lists the pools there are
    ],
    ids=["unknown-model", "unknown-pool"],
)
def test_a_wrong_model_or_pool_fails_the_job_at_resolve_with_a_message(
    foxhunt: Cluster, pods: PodRunner, parameters: tuple[str, ...], message: str
) -> None:
    defaults = {"model": "dqn", "gpu-pool": "ci-training-h100"}
    given = dict(p.split("=", 1) for p in parameters[1::2])
    settings = {**defaults, **given}
    name = _submit(
        foxhunt,
        *("-p", f"commit-sha={COMMIT}", "-p", f"model={settings['model']}", "-p", f"gpu-pool={settings['gpu-pool']}"),
        *(
            "-p",
            f"config={json.dumps(tiny_train_config())}",
        ),
    )
    phase = wait_until(lambda: _phase(foxhunt, name), 600, interval=1.0, what=f"{name} to end")
    assert phase == "Failed"
    resolve = next(run for run in pods.runs if run.workflow == name and run.template == "resolve")
    assert resolve.exit_code == 2 and message in resolve.log.read_text()
    assert "compile" not in pods.steps(name) and "train" not in pods.steps(name)
