"""argo/: the WorkflowTemplates and CronWorkflow validate upstream and keep the contracts others rely on."""

from __future__ import annotations

import importlib
import re
from typing import Any

import jsonschema
import pytest
import yaml

from service.backends.argo import pod_spec_patch
from service.pools import Pools, PoolsFile
from tests.deploy.conftest import ARGO_DIR, K8S_DIR, Doc, argo_doc, argo_files, load_docs

ARGO_GROUP = "argoproj.io"
GPU_TEMPLATES = ("compile", "hyperopt-trial", "train")
POOL = "{{workflow.parameters.gpu-pool}}"
POD_SPEC_PATCH = "{{workflow.parameters.pod-spec-patch}}"
# Retry only infrastructure failures: Argo's Error phase, or SIGTERM (143) from a drain/reclaim.
INFRA_ONLY = "lastRetry.status == 'Error' || (lastRetry.status == 'Failed' && asInt(lastRetry.exitCode) == 143)"


def _shipped_argo_objects(rendered: dict[str, list[Doc]]) -> list[tuple[str, Doc]]:
    objects = [(path.name, doc) for path in argo_files() for doc in load_docs(path)]
    for overlay, docs in rendered.items():
        objects += [(f"overlay {overlay}", d) for d in docs if d["apiVersion"].startswith(ARGO_GROUP)]
    return objects


def _errors(validator: jsonschema.protocols.Validator, doc: Doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in validator.iter_errors(doc)]


def test_every_argo_object_validates_against_the_crd_and_the_json_schema(
    rendered: dict[str, list[Doc]], argo_json_schema: Doc, argo_crds: dict[tuple[str, str], Doc]
) -> None:
    objects = _shipped_argo_objects(rendered)
    kinds = {doc["kind"] for _, doc in objects}
    assert kinds == {"WorkflowTemplate", "CronWorkflow"}, kinds
    top = jsonschema.Draft202012Validator(argo_json_schema)
    for where, doc in objects:
        crd = jsonschema.Draft7Validator(argo_crds[(doc["apiVersion"], doc["kind"])])
        name = f"{where}: {doc['kind']}/{doc['metadata']['name']}"
        assert not _errors(crd, doc), f"{name} fails the CRD schema: {_errors(crd, doc)}"
        assert not _errors(top, doc), f"{name} fails schema.json: {_errors(top, doc)}"


def test_schema_check_rejects_a_broken_template(argo_crds: dict[tuple[str, str], Doc]) -> None:
    """The validation above has teeth: a mistyped field fails the CRD schema."""
    doc = argo_doc("compile-and-train")
    doc["spec"]["templates"][0]["retryStrategy"] = {"limit": "3", "backoff": {"factor": [2]}}
    crd = jsonschema.Draft7Validator(argo_crds[(doc["apiVersion"], doc["kind"])])
    assert _errors(crd, doc)


def test_compile_and_train_declares_exactly_the_controllers_parameters() -> None:
    module = importlib.import_module("service.backends.argo_parameters")
    declared = [p["name"] for p in argo_doc("compile-and-train")["spec"]["arguments"]["parameters"]]
    assert len(declared) == len(set(declared)), f"duplicate parameters: {declared}"
    assert set(declared) == set(module.PARAMETER_NAMES)


def test_the_workflow_the_controller_generates_passes_exactly_the_templates_parameters() -> None:
    from service.backends.argo import workflow_manifest
    from tests.service.factories import job_spec

    spec = job_spec(hyperopt_trials=3)
    workflow = workflow_manifest(spec, progress_secret="s" * 32)
    template = argo_doc("compile-and-train")
    assert workflow["spec"]["workflowTemplateRef"]["name"] == template["metadata"]["name"]
    passed = [p["name"] for p in workflow["spec"]["arguments"]["parameters"]]
    assert sorted(passed) == sorted(p["name"] for p in template["spec"]["arguments"]["parameters"])


def test_no_parameter_overrides_the_config() -> None:
    """The resolved config is the one carrier of plan and steps: no template argument overrides it. The
    job's `model` and `train-epochs` reach resolve alone, which writes the resolved config."""
    doc = argo_doc("compile-and-train")
    declared = {p["name"] for p in doc["spec"]["arguments"]["parameters"]}
    assert "plan" not in declared and {"train-epochs", "model"} <= declared, declared
    for template in (t for t in doc["spec"]["templates"] if "container" in t):
        args = template["container"]["args"]
        assert "--override" not in args and "-o" not in args, template["name"]
        uses = {name for name in ("model", "train-epochs") if f"{{{{workflow.parameters.{name}}}}}" in args}
        assert uses == ({"model", "train-epochs"} if template["name"] == "resolve" else set()), template["name"]


def test_every_workflow_parameter_is_used_by_the_template() -> None:
    spec = argo_doc("compile-and-train")["spec"]
    body = yaml.safe_dump(spec["templates"]) + str(spec.get("podMetadata", ""))
    for param in spec["arguments"]["parameters"]:
        name = param["name"]
        assert f"workflow.parameters.{name}}}" in body or f"workflow.parameters['{name}']" in body, name


def _template(doc: Doc, name: str) -> Doc:
    return next(t for t in doc["spec"]["templates"] if t["name"] == name)


def _gpu_templates(doc: Doc) -> list[Doc]:
    return [t for t in doc["spec"]["templates"] if "podSpecPatch" in t]


@pytest.mark.parametrize("name", ["compile-and-train", "foxhunt-bench"])
def test_gpu_pods_select_their_pool_and_expose_metrics(name: str) -> None:
    doc = argo_doc(name)
    gpu = _gpu_templates(doc)
    assert gpu, f"{name} requests no GPU"
    if name == "compile-and-train":
        assert sorted(t["name"] for t in gpu) == sorted(GPU_TEMPLATES)
    for template in gpu:
        where = f"{name}/{template['name']}"
        container = template["container"]
        # The pool's nodes by convention (label and taints), then the pool's own placement over it.
        assert template["nodeSelector"] == {"foxhunt.io/pool": POOL}, where
        assert {(t["key"], t.get("value")) for t in template["tolerations"]} == {
            ("nvidia.com/gpu", None),
            ("foxhunt.io/pool", POOL),
        }, where
        assert template["podSpecPatch"] == POD_SPEC_PATCH, where
        assert "nvidia.com/gpu" not in str(container["resources"]), where
        assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"], where
        labels = template["metadata"]["labels"]
        assert labels["foxhunt.io/pool"] == POOL, where
        assert labels["app.kubernetes.io/name"] == "foxhunt-trainer", where
        if name == "compile-and-train":
            assert labels["kueue.x-k8s.io/queue-name"] == "{{workflow.parameters.queue-name}}", where
        assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in container["ports"], where
        env = {e["name"]: e for e in container["env"]}
        assert env["FOXHUNT_METRICS_PORT"]["value"] == "9400", where
        assert env["FOXHUNT_POOL"]["value"] == POOL, where
        assert container["image"] == "foxhunt-trainer:{{workflow.parameters.commit-sha}}", where
        _assert_infra_only_retry(template["retryStrategy"], where)
        assert int(template["activeDeadlineSeconds"]) > 0, where


def _assert_infra_only_retry(retry: Doc, where: str) -> None:
    assert retry["retryPolicy"] == "Always" and retry["expression"] == INFRA_ONLY, where
    assert retry["backoff"]["duration"] and int(retry["backoff"]["factor"]) >= 2, where
    assert "nodeAntiAffinity" in retry["affinity"], where


def test_cpu_helpers_request_no_gpu_and_retry_only_on_error() -> None:
    doc = argo_doc("compile-and-train")
    for name in ("resolve", "hyperopt-suggest", "hyperopt-best", "report", "on-exit"):
        template = _template(doc, name)
        body = template["container"]
        assert "nvidia.com/gpu" not in str(body["resources"]), name
        assert not {"nodeSelector", "tolerations", "podSpecPatch"} & set(template), name
        assert template["retryStrategy"]["retryPolicy"] == "OnError", name


def test_checkpoints_are_fixed_per_job_not_per_pod_or_retry() -> None:
    doc = argo_doc("compile-and-train")
    for name in ("train", "hyperopt-trial"):
        env = {e["name"]: e.get("value") for e in _template(doc, name)["container"]["env"]}
        url = env["FOXHUNT_CHECKPOINT_URL"]
        assert "{{workflow.parameters.job-id}}" in url, name
        assert not re.search(r"pod\.name|retries|workflow\.(name|uid)|node\.|attempt", url), url
    assert "--resume" in _template(doc, "train")["container"]["args"]


def test_lifecycle_bounds_are_set() -> None:
    for name in ("compile-and-train", "foxhunt-bench"):
        spec = argo_doc(name)["spec"]
        assert spec["activeDeadlineSeconds"] > 0
        assert spec["podGC"]["strategy"] in {"OnPodCompletion", "OnPodSuccess"}
        assert spec["ttlStrategy"]["secondsAfterSuccess"] > 0 and spec["ttlStrategy"]["secondsAfterFailure"] > 0
        assert spec["securityContext"]["runAsNonRoot"] is True
    spec = argo_doc("compile-and-train")["spec"]
    assert _template(argo_doc("compile-and-train"), spec["onExit"])["container"]["args"][0] == "finish"


def test_steps_run_resolve_then_compile_then_optional_search_then_train_then_report() -> None:
    doc = argo_doc("compile-and-train")
    main = _template(doc, doc["spec"]["entrypoint"])
    order = [[step["name"] for step in group] for group in main["steps"]]
    assert order == [["resolve"], ["compile"], ["hyperopt"], ["train", "train-best"], ["report"]]
    # resolve, which fails the job on an unknown pool, is a CPU pod that any node runs: it never waits for the pool.
    resolve = _template(doc, "resolve")
    assert resolve["retryStrategy"]["retryPolicy"] == "OnError" and "podSpecPatch" not in resolve
    whens = {step["name"]: step.get("when") for group in main["steps"] for step in group}
    assert whens["hyperopt"] == whens["train-best"] == "{{workflow.parameters.hyperopt-trials}} > 0"
    assert whens["train"] == "{{workflow.parameters.hyperopt-trials}} == 0"
    # The best config the search writes is the one the full run trains.
    best_out = _template(doc, "hyperopt-best")["container"]["args"]
    best_in = next(s for g in main["steps"] for s in g if s["name"] == "train-best")["arguments"]["parameters"][0]
    assert best_out[best_out.index("--out") + 1] == best_in["value"]


def test_hyperopt_fans_out_over_suggest_output_with_a_bounded_parallelism(rendered: dict[str, list[Doc]]) -> None:
    doc = argo_doc("compile-and-train")
    steps = [s for g in _template(doc, "hyperopt")["steps"] for s in g]
    assert [s["name"] for s in steps] == ["suggest", "trial", "best"]
    trial = steps[1]
    assert trial["withParam"] == "{{steps.suggest.outputs.result}}"
    assert trial["continueOn"] == {"failed": True}
    semaphore = _template(doc, "hyperopt-trial")["synchronization"]["semaphores"][0]["configMapKeyRef"]
    for overlay, docs in rendered.items():
        maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
        assert semaphore["name"] in maps, f"{overlay}: semaphore ConfigMap {semaphore['name']} not rendered"
        assert int(maps[semaphore["name"]]["data"][semaphore["key"]]) >= 1, overlay
    study = {_arg(_template(doc, t), "--study") for t in ("hyperopt-suggest", "hyperopt-trial", "hyperopt-best")}
    assert study == {"foxhunt-{{workflow.parameters.job-id}}"}


def _arg(template: Doc, flag: str) -> Any:
    args = template["container"]["args"]
    return args[args.index(flag) + 1]


def test_nightly_cron_runs_the_bench_template_on_a_pool_of_each_overlay(rendered: dict[str, list[Doc]]) -> None:
    cron = argo_doc("foxhunt-bench-nightly")["spec"]
    assert cron["workflowSpec"]["workflowTemplateRef"]["name"] == "foxhunt-bench"
    assert cron["concurrencyPolicy"] == "Forbid" and len(cron["schedules"]) == 1
    declared = {p["name"] for p in argo_doc("foxhunt-bench")["spec"]["arguments"]["parameters"]}
    assert {p["name"] for p in cron["workflowSpec"]["arguments"]["parameters"]} == declared
    for overlay, docs in rendered.items():
        pools_map = next(
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("foxhunt-pools")
        )
        pools = Pools(PoolsFile.model_validate(yaml.safe_load(pools_map["data"]["pools.yaml"])).pools)
        crons = [d for d in docs if d["kind"] == "CronWorkflow"]
        values = {p["name"]: p["value"] for p in crons[0]["spec"]["workflowSpec"]["arguments"]["parameters"]}
        pool = values["gpu-pool"]
        assert pool in {p.name for p in pools}, f"{overlay}: nightly bench pool {pool!r} is not a configured pool"
        # The pool's own placement with one GPU, exactly as the controller would send it for the pool.
        placement = pools.get(pool).placement().model_copy(update={"gpus": 1})
        assert values["pod-spec-patch"] == pod_spec_patch(placement), f"{overlay}: nightly bench placement"


def test_kustomize_sets_the_trainer_registry_but_keeps_the_commit_tag(rendered: dict[str, list[Doc]]) -> None:
    for overlay, docs in rendered.items():
        for doc in (d for d in docs if d["kind"] == "WorkflowTemplate"):
            images = re.findall(r"image: (\S+)", yaml.safe_dump(doc))
            assert images, overlay
            assert all(i.endswith(":{{workflow.parameters.commit-sha}}") or i.endswith("}}") for i in images)
            assert all("/" in i for i in images), f"{overlay}: trainer image without a registry: {images}"


def test_the_argo_kustomization_lists_every_argo_file() -> None:
    kustomization = yaml.safe_load((ARGO_DIR / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in argo_files())
    base = yaml.safe_load((K8S_DIR / "base" / "kustomization.yaml").read_text())
    assert "../../argo" in base["resources"]
