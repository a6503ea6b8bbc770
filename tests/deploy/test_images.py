"""Both images built and run for real, with no registry of images (marker `images`: `make test-images`, CI).

A Docker engine of our own (Debian's docker.io, its data cached in /var/cache/foxhunt-docker, no bridge,
no iptables) builds both targets with scripts/images.sh, on local stand-ins for the two base images. Then:
- the service image serves /healthz and takes a job from `foxhunt submit` on the local backend, as
  k8s/base's Deployment runs it: user 10001, read-only root filesystem, no capabilities, /tmp a volume;
- the trainer image runs every step of the job pipeline (contracts/pipeline.py) on a tiny CPU config as
  the Argo templates run it: their command, the pipeline's arguments, the template's environment,
  user 10001, read-only root, /data and /tmp as volumes, the config at /inputs/config.json, and for
  resolve k8s/base's pools file where the template mounts the foxhunt-pools ConfigMap;
- the service image holds no torch, and each image's size and build time are reported.
Everything stays on loopback: builds and the service use `--network host`, the trainer steps
`--network none` (they need no network at all).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from contracts.pipeline import (
    BEST,
    CHECK,
    EXIT,
    PIPELINE,
    REPORT,
    RESOLVE,
    RESOLVED_CONFIG,
    SUGGEST,
    TRAIN,
    TRIAL,
    Step,
)
from tests.deploy.conftest import ARGO_DIR, K8S_DIR, ROOT, load_docs
from tests.docker_engine import DOCKER, Engine, docker_engine
from tests.polling import wait_until
from tests.ports import free_port

# The first test builds both images in its setup (3 to 6 minutes on 2 cores, more on a loaded machine: the
# PyTorch stand-in downloads PyPI's CUDA build of torch, 2.6 GB with its nvidia-* wheels).
pytestmark = [pytest.mark.images, pytest.mark.timeout(1800)]

TAG = "images-test"
SERVICE, TRAINER = f"foxhunt-service:{TAG}", f"foxhunt-trainer:{TAG}"
USER = "10001:10001"  # runAsUser/runAsGroup of k8s/base's Deployment and of the Argo templates
# What `securityContext` asks of every container: no privilege escalation, no capabilities, read-only root.
HARDENED = ["--user", USER, "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]

JOB = "job-images"
# The Argo workflow parameters that the templates' env and args refer to, as a controller would pass them.
# The pool is k8s/base's one (its pools.yaml, the foxhunt-pools ConfigMap): resolve checks it against that file.
POOL = "default"
POOLS = K8S_DIR / "base" / "pools.yaml"
WORKFLOW_PARAMETERS = {"job-id": JOB, "gpu-pool": POOL, "commit-sha": TAG, "progress-token": "", "queue-name": ""}
STORAGE = "sqlite:////data/optuna.db"  # the shared volume stands in for the Optuna database
SECRETS = {"FOXHUNT_OPTUNA_STORAGE": STORAGE}  # required secret-backed env of the templates, bound here
TRIALS = 2
# The pipeline's placeholders bound to the pod's paths, as argo/render.py binds them.
VALUES = {
    "config": "/inputs/config.json",
    "model": "dqn",
    "train_epochs": "0",  # TINY sets run.steps: the job gives its length once
    "pool": POOL,
    "pools": "/etc/foxhunt/pools/pools.yaml",
    "run": f"/data/runs/{JOB}",
    "checkpoints": f"/data/checkpoints/{JOB}",
    "storage": STORAGE,
    "study": f"foxhunt-{JOB}",
    "trials": str(TRIALS),
    "config_file": RESOLVED_CONFIG.format(run=f"/data/runs/{JOB}"),  # train from the resolved config
    "status": "Succeeded",
    "duration": "12.5",
    "failures": "null",
}
TINY: dict[str, Any] = {
    "model": {
        "hidden": 16, "head_hidden": 16, "atoms": 11, "iqn_embed": 8, "iqn_hidden": 16, "iqn_taus": 4,
        "iqn_target_taus": 4, "iql_hidden": 8, "attn_window": 4, "attn_dim": 8, "attn_heads": 2, "attn_ffn": 16,
    },
    "replay": {"capacity": 256},
    "run": {"steps": 8, "batch_size": 16, "device": "cpu", "cpu_threads": 1, "eval_episodes": 1, "log_every": 4,
            "checkpoint_every": 4},
    "data": {"source": "market", "learning_starts": 32, "market_features": 16, "market_horizon": 16, "num_envs": 2},
}  # fmt: skip


def _terminal(config: pytest.Config, line: str) -> None:
    """One line on the terminal, whatever pytest captures (the build times and sizes are the report)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    """dockerd as the issue runs it (its layers cached for the next run, and for the cluster tests)."""
    with docker_engine() as client:
        yield client


@pytest.fixture(scope="module")
def images(engine: Engine, pytestconfig: pytest.Config) -> dict[str, int]:
    """scripts/images.sh: both stand-in bases, then both targets. Returns each image's size in MB."""
    env = {**os.environ, "DOCKER": DOCKER, "DOCKER_HOST": engine.host, "TAG": TAG}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "images.sh")], env=env, capture_output=True, text=True, timeout=1500
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    report = [line for line in result.stdout.splitlines() if line.startswith("images: ")]
    for line in report:
        _terminal(pytestconfig, line)
    return {m[1]: int(m[2]) for m in (re.match(r"images: (\S+) size (\d+) MB", line) for line in report) if m}


def test_both_targets_build_and_every_size_is_reported(images: dict[str, int]) -> None:
    assert set(images) == {"foxhunt-base/python:3.11-bookworm", "foxhunt-base/pytorch:2.13.0-cpu", SERVICE, TRAINER}
    # The point of the split: the controller's image is a fraction of the trainer's.
    assert images[SERVICE] < images[TRAINER] / 3, images


@pytest.mark.parametrize("image", [SERVICE, TRAINER])
def test_images_run_as_the_non_root_user(engine: Engine, images: dict[str, int], image: str) -> None:
    user = engine("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == USER


def test_service_image_holds_no_torch(engine: Engine, images: dict[str, int]) -> None:
    probe = "import importlib.util as u; print([m for m in ('torch', 'triton', 'numpy') if u.find_spec(m)])"
    result = engine("run", "--rm", "--network", "none", *HARDENED, "--entrypoint", "python", SERVICE, "-c", probe)
    assert result.stdout.strip() == "[]"
    # ...while the same probe does find torch in the trainer image, so the probe can tell.
    result = engine("run", "--rm", "--network", "none", *HARDENED, "--entrypoint", "python", TRAINER, "-c", probe)
    assert "torch" in result.stdout


@pytest.fixture(scope="module")
def service(engine: Engine, images: dict[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The service image on the local backend, as the Deployment runs it; yields its base URL."""
    tmp = tmp_path_factory.mktemp("service-tmp")
    tmp.chmod(0o1777)  # the emptyDir at /tmp: the only writable place
    port = free_port()
    name = "foxhunt-service-test"
    engine(
        "run", "-d", "--name", name, "--network", "host", *HARDENED, "-v", f"{tmp}:/tmp",
        "-e", "FOXHUNT_BACKEND=local", "-e", "FOXHUNT_AUTH_DISABLED=true",
        SERVICE, "serve", "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            state = engine("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            if state != "running":
                raise AssertionError(f"service container {state}: {engine('logs', name, check=False).stderr[-3000:]}")
            return httpx.get(f"{url}/healthz", timeout=5).status_code == 200

        wait_until(healthy, timeout=120, interval=0.5, what="/healthz", ignore=(httpx.TransportError,))
        yield url
    finally:
        engine("rm", "-f", name, check=False)


def test_service_serves_healthz_as_the_deployment_runs_it(engine: Engine, service: str) -> None:
    response = httpx.get(f"{service}/healthz", timeout=5)
    assert response.status_code == 200
    # The container really is user 10001 on a read-only root: nothing but the /tmp volume is writable.
    probe = engine("exec", "foxhunt-service-test", "sh", "-c", "id -u; touch /opt/x 2>&1; touch /tmp/x && echo tmp ok")
    lines = probe.stdout.splitlines()
    assert lines[0] == "10001"
    assert "Read-only file system" in lines[1]
    assert lines[2] == "tmp ok"


def test_service_takes_a_job_from_foxhunt_submit(service: str, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    foxhunt = Path(sys.executable).parent / "foxhunt"  # the client from this checkout, on the host
    submitted = subprocess.run(
        [str(foxhunt), "submit", "--config", str(config), "--name", "images-test", "--api-url", service, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    fetched = httpx.get(f"{service}/v1/jobs/{job['id']}", timeout=5)
    assert fetched.status_code == 200
    assert fetched.json()["config"]["run"]["steps"] == TINY["run"]["steps"]


def _templates() -> dict[str, dict[str, Any]]:
    """The container templates of argo/compile-and-train.yaml, by name."""
    (template,) = [d for d in load_docs(ARGO_DIR / "compile-and-train.yaml") if d["kind"] == "WorkflowTemplate"]
    return {t["name"]: t for t in template["spec"]["templates"] if "container" in t}


def _bind(text: str, inputs: dict[str, str]) -> str:
    """An Argo expression's value here: workflow parameters and the template's inputs."""
    text = re.sub(r"\{\{workflow\.parameters\.([\w-]+)\}\}", lambda m: WORKFLOW_PARAMETERS[m[1]], text)
    return re.sub(r"\{\{inputs\.parameters\.([\w-]+)\}\}", lambda m: inputs[m[1]], text)


def _environment(container: dict[str, Any], inputs: dict[str, str]) -> list[str]:
    """`-e` options for a template's env: plain values bound; secrets from SECRETS; optional refs left unset."""
    out = []
    for var in container.get("env", []):
        if "value" in var:
            out += ["-e", f"{var['name']}={_bind(var['value'], inputs)}"]
            continue
        (ref,) = var["valueFrom"].values()
        if var["name"] in SECRETS:
            out += ["-e", f"{var['name']}={SECRETS[var['name']]}"]
        else:
            assert ref.get("optional"), f"{var['name']}: a required reference this test does not bind"
    return out


def _run_step(engine: Engine, step: Step, data: Path, tmp: Path, config: Path, **extra: str) -> str:
    """`step`'s command in the trainer image as its Argo template runs it; returns its stdout."""
    container = _templates()[step.name]["container"]
    assert container["command"] == ["python", "-m", "trainer"], container["command"]
    args = step.command(VALUES | extra)
    # The pools ConfigMap where the template mounts it (resolve), holding k8s/base's pools.yaml.
    mounts = {mount["name"]: mount["mountPath"] for mount in container.get("volumeMounts", [])}
    pools = ["-v", f"{POOLS}:{mounts['pools']}/pools.yaml:ro"] if "pools" in mounts else []
    result = engine(
        "run", "--rm", "--network", "none", *HARDENED,
        "-v", f"{data}:/data", "-v", f"{tmp}:/tmp", "-v", f"{config}:/inputs/config.json:ro", *pools,
        *_environment(container, extra), "--entrypoint", container["command"][0], TRAINER, *container["command"][1:],
        *args, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"{step.name}: {' '.join(args)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result.stdout


def test_trainer_image_runs_every_pipeline_step(engine: Engine, images: dict[str, int], tmp_path: Path) -> None:
    data, tmp = tmp_path / "data", tmp_path / "tmp"
    for volume in (data, tmp):
        volume.mkdir()
        volume.chmod(0o1777)  # fsGroup 10001 makes the volumes writable to the pod's user
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    run = data / "runs" / JOB
    suggested: list[int] = []

    def resolved(_: str) -> None:
        # resolve wrote the resolved config that every later step reads.
        assert json.loads((run / "config.json").read_text())["run"]["steps"] == TINY["run"]["steps"]

    def checked(_: str) -> None:
        assert json.loads((run / "check" / "check.json").read_text())

    def suggest(stdout: str) -> None:
        suggested.extend(json.loads(stdout.strip().splitlines()[-1]))
        assert suggested == [",".join(map(str, range(TRIALS)))]  # the trials differ in packable fields: one pack

    def trials(_: str) -> None:
        assert all((data / "checkpoints" / JOB / f"trial-{n}").is_dir() for n in range(TRIALS))

    def best(_: str) -> None:
        assert json.loads((run / "hyperopt" / "best-config.json").read_text())["run"]["steps"] == TINY["run"]["steps"]

    def trained(_: str) -> None:
        assert (data / "checkpoints" / JOB / "train").is_dir()
        assert json.loads((run / "train" / "summary.json").read_text())

    def report(stdout: str) -> None:
        assert json.loads(stdout.strip().splitlines()[-1])["steps"] == TINY["run"]["steps"]

    def finished(_: str) -> None:
        assert json.loads((run / "status.json").read_text())["status"] == "Succeeded"

    # What each step's run must leave behind, by step and in the pipeline's order: a step added, removed or
    # moved in the pipeline fails this test until the test runs and checks it too.
    checks = {
        RESOLVE: resolved, CHECK: checked, SUGGEST: suggest, TRIAL: trials, BEST: best, TRAIN: trained,
        REPORT: report, EXIT: finished,
    }  # fmt: skip
    assert list(checks) == [step.name for step in PIPELINE.steps()]  # every step, in the pipeline's order

    for step in PIPELINE.steps():  # each step reads what the earlier ones wrote
        if step.name == TRIAL:  # one pod per pack that suggest printed, as Argo fans them out
            stdout = "".join(_run_step(engine, step, data, tmp, config, pack=pack) for pack in suggested)
        else:
            stdout = _run_step(engine, step, data, tmp, config)
        checks[step.name](stdout)
