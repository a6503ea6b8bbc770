"""k8s/: every overlay renders, validates strictly for a stated Kubernetes version and stays least-privilege."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import OVERLAYS, Doc

# Oldest and newest minor the manifests are checked against (kubernetes-validate ships 1.25-1.37).
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CRD_GROUPS = ("argoproj.io", "monitoring.coreos.com")


def _core(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["apiVersion"].split("/")[0] not in CRD_GROUPS]


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]


def test_each_overlay_renders_the_whole_controller(rendered: dict[str, list[Doc]]) -> None:
    assert set(rendered) == set(OVERLAYS)
    for overlay, docs in rendered.items():
        kinds = {d["kind"] for d in docs}
        assert {
            "Namespace",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "ConfigMap",
            "PersistentVolumeClaim",
            "WorkflowTemplate",
            "CronWorkflow",
        } <= kinds, overlay
        namespace = _one(docs, "Namespace", "foxhunt")["metadata"]["name"]
        assert all(d["metadata"].get("namespace") == namespace for d in docs if d["kind"] != "Namespace"), overlay
        # Secrets are referenced, never shipped: the one Secret is the executor's token, which the
        # cluster fills in (it carries no value of ours).
        secrets = [d for d in docs if d["kind"] == "Secret"]
        assert [(d["metadata"]["name"], d["type"], d.get("data"), d.get("stringData")) for d in secrets] == [
            ("foxhunt-workflow.service-account-token", "kubernetes.io/service-account-token", None, None)
        ], overlay


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_validate_strictly(rendered: dict[str, list[Doc]], version: str) -> None:
    for overlay, docs in rendered.items():
        for doc in _core(docs):
            where = f"{overlay}: {doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}"
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{where}: {error.message} at {'/'.join(map(str, error.path))}")


def test_strict_validation_rejects_an_unknown_field(rendered: dict[str, list[Doc]]) -> None:
    deployment = _one(rendered["dev"], "Deployment", "foxhunt-controller")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_prometheus_operator_objects_validate_against_their_crds(
    rendered: dict[str, list[Doc]], prometheus_crds: dict[tuple[str, str], Doc]
) -> None:
    """Only objects that exist are checked: the monitoring component belongs to another part."""
    for overlay, docs in rendered.items():
        for doc in (d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com")):
            schema = prometheus_crds[(doc["apiVersion"], doc["kind"])]
            errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
            assert not errors, f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {errors[:3]}"


def test_controller_role_is_least_privilege(rendered: dict[str, list[Doc]]) -> None:
    for overlay, docs in rendered.items():
        rules = _one(docs, "Role", "foxhunt-controller")["rules"]
        granted = {
            (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
        }
        expected = {("argoproj.io", "workflows", v) for v in ("create", "get", "list", "watch", "patch")}
        expected |= {("argoproj.io", "workflowtemplates", v) for v in ("get", "list")}
        expected |= {("", r, v) for r in ("pods", "pods/log") for v in ("get", "list", "watch")}
        expected |= {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}  # leader election
        assert granted == expected, overlay
        assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")], overlay
        binding = _one(docs, "RoleBinding", "foxhunt-controller")
        namespace = binding["metadata"]["namespace"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "foxhunt-controller", "namespace": namespace}]


def test_controller_deployment_is_hardened_and_wired_to_its_settings(rendered: dict[str, list[Doc]]) -> None:
    for overlay, docs in rendered.items():
        deployment = _one(docs, "Deployment", "foxhunt-controller")
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["serviceAccountName"] == "foxhunt-controller"
        (container,) = pod["containers"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        assert ":" in container["image"] and "/" in container["image"], f"{overlay}: image not set by the overlay"
        env = {e["name"]: e for e in container["env"]}
        assert env["FOXHUNT_BACKEND"]["value"] == "argo"
        assert "secretKeyRef" in env["FOXHUNT_DATABASE_URL"]["valueFrom"]
        progress_secret = env["FOXHUNT_PROGRESS_SECRET"]["valueFrom"]["secretKeyRef"]
        assert progress_secret == {"name": "foxhunt-progress", "key": "secret"}
        progress_url = _one(docs, "ConfigMap", "foxhunt-trainer-env")["data"]["FOXHUNT_PROGRESS_URL"]
        assert progress_url == f"http://{_one(docs, 'Service', 'foxhunt-controller')['metadata']['name']}:8000"
        assert env["FOXHUNT_ARGO_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        pools_path = Path(env["FOXHUNT_POOLS_FILE"]["value"])
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(pools_path.parent))
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        pools_map = _one(docs, "ConfigMap", "foxhunt-pools")
        assert volume["configMap"]["name"] == pools_map["metadata"]["name"] != "foxhunt-pools", "name hash kept"
        assert pools_path.name in pools_map["data"]
        service = _one(docs, "Service", "foxhunt-controller")
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        pdb = _one(docs, "PodDisruptionBudget", "foxhunt-controller")
        assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_pools_file_of_each_overlay_loads_in_the_controller(rendered: dict[str, list[Doc]], tmp_path: Path) -> None:
    from service.pools import Pools

    for overlay, docs in rendered.items():
        path = tmp_path / f"{overlay}.yaml"
        path.write_text(_one(docs, "ConfigMap", "foxhunt-pools")["data"]["pools.yaml"])
        for pool in Pools.load(path):
            assert pool.node_selector.get("foxhunt.io/pool") == pool.name, f"{overlay}: {pool.name}"
            assert any(t.key == "nvidia.com/gpu" for t in pool.tolerations), f"{overlay}: {pool.name}"


def test_resolve_checks_the_pool_against_the_controllers_own_pools_file(rendered: dict[str, list[Doc]]) -> None:
    """The WorkflowTemplate mounts the very ConfigMap the controller reads, its hashed name included."""
    for overlay, docs in rendered.items():
        pools_map = _one(docs, "ConfigMap", "foxhunt-pools")
        spec = _one(docs, "WorkflowTemplate", "compile-and-train")["spec"]
        (volume,) = [v for v in spec["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"] == pools_map["metadata"]["name"] != "foxhunt-pools", overlay
        resolve = next(t for t in spec["templates"] if t["name"] == "resolve")
        mount = next(m for m in resolve["container"]["volumeMounts"] if m["name"] == volume["name"])
        args = resolve["container"]["args"]
        assert args[args.index("--pools-file") + 1] == f"{mount['mountPath']}/pools.yaml", overlay
        assert "pools.yaml" in pools_map["data"], overlay


def test_network_policies_cover_controller_and_trainer_pods(rendered: dict[str, list[Doc]]) -> None:
    for overlay, docs in rendered.items():
        policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
        controller, trainer = policies["foxhunt-controller"], policies["foxhunt-trainer"]
        assert controller["policyTypes"] == ["Ingress", "Egress"], overlay
        assert [p["port"] for rule in controller["ingress"] for p in rule["ports"]] == [8000]
        assert trainer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "foxhunt-trainer"}
        assert [p["port"] for rule in trainer["ingress"] for p in rule["ports"]] == [9400]
