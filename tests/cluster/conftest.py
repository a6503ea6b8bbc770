"""The cluster tests' cluster: a real kube-apiserver, scheduler, controller-manager and Argo
workflow-controller (scripts/cluster.sh), and our own manifests (k8s/base, argo/) applied as an
operator applies them. Two kinds of nodes take the pods, one kind at a time (the other cordoned):
- stage 1, kwok's fake nodes labelled and tainted like our pools, whose pods' commands run as
  processes of this machine (the `pods` fixture, tests/cluster/pods.py);
- stage 2, the real node: a kubelet on containerd running the trainer image that scripts/images.sh
  builds from this checkout, and Argo's own argoexec (the `real_node` fixture).

`make test-cluster` runs these (marker `cluster`, off in `make test`). The session starts the cluster
when it is not up (the first time it builds it from source: scripts/cluster.sh) and stops it again if
it started it. Every test gets the `foxhunt` namespace of k8s/base, as the seed's commands name it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from kubernetes import client, config

from service.app import create_app
from service.auth import create_token
from service.settings import Settings
from tests.cluster.pods import PodRunner
from tests.docker_engine import DOCKER, docker_engine
from tests.polling import wait_until
from tests.service.factories import live_server, make_settings
from tests.upstream import versions

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster.sh"
OVERLAY = Path(__file__).with_name("overlay")
PERSISTENT_VOLUME = "foxhunt-data-cluster-tests"
NAMESPACE = "foxhunt"
OPTUNA_STORAGE = "sqlite:////data/optuna.db"  # on the shared volume: one file per job's study
CACHE = Path(os.environ.get("FOXHUNT_CLUSTER_CACHE", "/var/cache/foxhunt-cluster"))
NODE_IP = "10.88.0.1"  # the real node's address (scripts/cluster.sh): where its pods reach this machine
REAL_NODE = "foxhunt-node-0"

pytestmark = pytest.mark.cluster


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    bin: Path  # kubectl
    argo_bin: Path  # the argo CLI

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def argo(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The argo CLI, built from Argo's module (it talks to the API server, no Argo server needed)."""
        command = [str(self.argo_bin), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]], namespace: str = NAMESPACE) -> None:
        docs = manifest if isinstance(manifest, list) else [manifest]
        self.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))

    def api_client(self, token: str | None = None) -> client.ApiClient:
        """A client as the admin, or, given a service account's token, as that account."""
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        if token is not None:
            configuration.cert_file = configuration.key_file = None
            configuration.api_key = {"authorization": f"Bearer {token}"}
        configuration.retries = 0
        return client.ApiClient(configuration)

    def measure(self, pod: str) -> subprocess.CompletedProcess[str]:
        """The seed's measure command, as a shell runs it: the pod's log through grep."""
        return subprocess.run(
            f"{self.bin}/kubectl --kubeconfig {self.kubeconfig} logs {pod} -n {NAMESPACE} -c main"
            ' | grep "Training step breakdown"',
            shell=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    def token(self, service_account: str, namespace: str = NAMESPACE) -> str:
        """A short-lived token of a service account (TokenRequest), as a pod of it would hold."""
        return self.kubectl("create", "token", service_account, "-n", namespace, "--duration", "1h").stdout.strip()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        pytest.fail("the cluster tests build the cluster with Go 1.26+ (scripts/cluster.sh); Go is not installed")
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True).returncode == 0
    env = {**os.environ, "PATH": f"/usr/local/go/bin:{os.environ['PATH']}"}
    up = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, env=env, timeout=3600)
    if up.returncode != 0:
        pytest.fail(f"scripts/cluster.sh up failed:\n{up.stderr[-4000:]}")
    yield Cluster(
        kubeconfig=Path(up.stdout.strip().splitlines()[-1]),
        bin=CACHE / f"kubernetes-{versions()['KUBERNETES_VERSION']}" / "bin",
        argo_bin=CACHE / f"argo-{versions()['ARGO_VERSION']}" / "bin" / "argo",
    )
    if not was_up:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `foxhunt-data` volume: a hostPath PersistentVolume bound to k8s/base's claim."""
    return tmp_path_factory.mktemp("foxhunt-data")


@pytest.fixture(scope="session")
def foxhunt(cluster: Cluster, data_dir: Path) -> Iterator[Cluster]:
    """k8s/base applied as an operator applies it, through the tests' overlay (tests/cluster/overlay:
    the controller's Deployment, RBAC, the templates, the pools), a fake node for each pool, the volume
    bound, and the Optuna storage secret the templates read."""
    # What an earlier session left (one that was killed before its teardown)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s")
    cluster.kubectl("delete", "pv", PERSISTENT_VOLUME, "--ignore-not-found", "--wait=true", "--timeout=60s")
    cluster.kubectl("apply", "--server-side", "-k", str(OVERLAY))
    for pool in yaml.safe_load((OVERLAY / "pools.yaml").read_text())["pools"]:
        subprocess.run([str(SCRIPT), "node", pool["name"]], check=True, capture_output=True, timeout=120)
    data_dir.chmod(0o777)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": PERSISTENT_VOLUME},
            "spec": {
                "capacity": {"storage": "200Gi"},
                "accessModes": ["ReadWriteMany"],
                "hostPath": {"path": str(data_dir)},
                "claimRef": {"namespace": NAMESPACE, "name": "foxhunt-data"},
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "foxhunt-optuna"},
            "data": {"storage-url": base64.b64encode(OPTUNA_STORAGE.encode()).decode()},
        }
    )
    wait_until(
        lambda: (
            cluster.kubectl("get", "pvc", "foxhunt-data", "-n", NAMESPACE, "-o", "jsonpath={.status.phase}").stdout
            == "Bound"
        ),
        60,
        what="the foxhunt-data claim to bind",
    )
    yield cluster
    cluster.kubectl("delete", "pv", PERSISTENT_VOLUME, "--ignore-not-found", "--wait=false", check=False)


def use_nodes(kind: str) -> None:
    """`real` or `kwok`: which nodes take new pods (scripts/cluster.sh cordons the others)."""
    subprocess.run([str(SCRIPT), "use", kind], check=True, capture_output=True, timeout=120)


@pytest.fixture
def pods(foxhunt: Cluster, data_dir: Path, tmp_path: Path) -> Iterator[PodRunner]:
    """The stand-in for kubelet and argoexec on the fake nodes (tests/cluster/pods.py)."""
    use_nodes("kwok")
    reporter = foxhunt.api_client(token=foxhunt.token("foxhunt-workflow"))
    with PodRunner(foxhunt.api_client(), reporter, NAMESPACE, tmp_path) as runner:
        yield runner


@pytest.fixture(scope="session")
def trainer_image(cluster: Cluster) -> str:
    """The trainer image of this checkout on the real node; returns its tag, which jobs give as their commit.

    scripts/images.sh builds it on the tests' own Docker engine (tests/docker_engine.py: after the images
    tests, only what changed is rebuilt), and `scripts/cluster.sh load` copies it into the
    node's containerd. The tag is the image's own id: a changed checkout is a new image, never a stale one.
    """
    with docker_engine() as engine:
        env = {**os.environ, "DOCKER": DOCKER, "DOCKER_HOST": engine.host, "TAG": "cluster-tests"}
        built = subprocess.run(
            ["bash", str(ROOT / "scripts" / "images.sh")], env=env, capture_output=True, text=True, timeout=1800
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
        image_id = engine("image", "inspect", "--format", "{{.Id}}", "foxhunt-trainer:cluster-tests").stdout
        tag = image_id.strip().removeprefix("sha256:")[:12]
        for stale in engine("images", "foxhunt-trainer", "--format", "{{.Tag}}").stdout.split():
            if stale not in {tag, "cluster-tests", "images-test"}:  # an earlier checkout's, now unused
                engine("rmi", f"foxhunt-trainer:{stale}")
        engine("tag", "foxhunt-trainer:cluster-tests", f"foxhunt-trainer:{tag}")
        loaded = subprocess.run(
            [str(SCRIPT), "load", f"foxhunt-trainer:{tag}"], env=env, capture_output=True, text=True, timeout=1800
        )
        assert loaded.returncode == 0, loaded.stderr[-3000:]
    return tag


@pytest.fixture
def real_node(foxhunt: Cluster, trainer_image: str, data_dir: Path) -> str:
    """Stage 2: new pods go to the real node, which holds the trainer image; returns the image's tag."""
    use_nodes("real")
    # Stage 1's stand-in runs the steps as root on this machine, the real pods as the templates' user
    # 10001: what the stand-in left on the shared volume (runs/, the Optuna database) is opened to them.
    subprocess.run(["chmod", "-R", "a+rwX", str(data_dir)], check=True, timeout=60)
    return trainer_image


def workflow(cluster: Cluster, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "workflow", name, "-n", NAMESPACE, "-o", "json").stdout)  # type: ignore[no-any-return]


PROGRESS_SECRET = "progress-secret-of-the-cluster-tests-0123456789"


def service_account_kubeconfig(cluster: Cluster, path: Path, service_account: str) -> Path:
    """A kubeconfig holding a service account's token, so the client is what the account may do (RBAC)."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "foxhunt", "cluster": server}],
                "users": [{"name": service_account, "user": {"token": cluster.token(service_account)}}],
                "contexts": [{"name": "foxhunt", "context": {"cluster": "foxhunt", "user": service_account}}],
                "current-context": "foxhunt",
            }
        )
    )
    return path


@dataclass
class Controller:
    """A controller on the Argo backend, as k8s/base deploys it: the controller's service account, the
    overlay's pools; its URL is where the trainer pods report progress (foxhunt-trainer-env)."""

    url: str
    api: httpx.Client
    app: FastAPI

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api.get(f"/v1/jobs/{job_id}").json()  # type: ignore[no-any-return]

    def wait_for(self, job_id: str, states: set[str], timeout: float = 600.0) -> dict[str, Any]:
        seen: list[str] = []

        def reached() -> dict[str, Any] | None:
            job = self.job(job_id)
            seen.append(job["state"])
            return job if job["state"] in states else None

        try:
            return wait_until(reached, timeout, interval=0.5, what=f"job {job_id} to reach {sorted(states)}")
        except AssertionError:
            raise AssertionError(f"job {job_id} stayed {seen[-1]}: {self.job(job_id)}") from None


def controller_settings(foxhunt: Cluster, folder: Path, **overrides: Any) -> Settings:
    folder.mkdir(parents=True, exist_ok=True)
    fields: dict[str, Any] = {
        "backend": "argo",
        "kubeconfig": service_account_kubeconfig(foxhunt, folder / "kubeconfig", "foxhunt-controller"),
        "argo_namespace": NAMESPACE,
        "pools_file": OVERLAY / "pools.yaml",
        "progress_secret": PROGRESS_SECRET,
        "leader_election": False,
        "reconcile_interval_seconds": 0.5,
        "cancel_grace_seconds": 600.0,
        **overrides,
    }
    return make_settings(folder, **fields)


@contextmanager
def serve_controller(foxhunt: Cluster, folder: Path, host: str = "127.0.0.1", **overrides: Any) -> Iterator[Controller]:
    app = create_app(controller_settings(foxhunt, folder, **overrides))
    secret, _ = create_token(app.state.services.store, name="alice", tenant="team-a")
    with live_server(app, host) as url:
        foxhunt.kubectl(
            "patch", "configmap", "foxhunt-trainer-env", "-n", NAMESPACE, "--type", "merge",
            "-p", json.dumps({"data": {"FOXHUNT_PROGRESS_URL": url}}),
        )  # fmt: skip
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as api:
            yield Controller(url, api, app)


@pytest.fixture
def controller(foxhunt: Cluster, tmp_path: Path) -> Iterator[Controller]:
    with serve_controller(foxhunt, tmp_path / "controller") as served:
        yield served


@pytest.fixture
def real_controller(foxhunt: Cluster, real_node: str, tmp_path: Path) -> Iterator[Controller]:
    """The controller where the real node's pods reach it (the bridge's address), for their progress reports;
    a step waits 20 s for an image it cannot pull before its job fails."""
    with serve_controller(foxhunt, tmp_path / "controller", NODE_IP, image_pull_grace_seconds=20.0) as served:
        yield served
