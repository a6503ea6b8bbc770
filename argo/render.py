"""Renders the Argo objects under argo/ from the job pipeline with Hera: `python -m argo.render` (`make argo`).

What a job runs is the graph `contracts.pipeline.PIPELINE`; this module compiles it: each graph a
Steps template whose parallel groups are the graph's layers (a node's `when` an Argo `when`, a fan-out
a `withParam` over its source's output), each step a container template with its placeholders bound
to Argo expressions and paths on the shared volume, its pod (image, env, resources, security,
labels) and its retry policy. The YAML it writes is
committed for operators who `kubectl apply -k argo/`, and tests/argo/test_render.py fails when the
committed files differ from what this renders.

Placement of GPU steps: each GPU template selects its pool by convention, `nodeSelector:
{foxhunt.io/pool: <gpu-pool>}` and tolerations of `nvidia.com/gpu` and of the `foxhunt.io/pool=<gpu-pool>`
taint (`pool_convention` in service/backends/argo_parameters.py), so a Workflow submitted without the
controller lands on its pool's nodes. The controller's `pod-spec-patch` parameter, applied through
`podSpecPatch` as a strategic merge patch, then makes the pool's own config win: nodeSelector merges key
by key, tolerations replace the template's list, containers merge by name (the GPU resource of `main`).
So the pools config drives placement without one template per pool, and a Workflow still only
references a template and passes parameters (clusters may run Argo with `templateReferencing: Strict`).

The first step, resolve, a CPU pod with no placement, checks `gpu-pool` against the controller's pools
file, mounted from the `foxhunt-pools` ConfigMap (Kustomize rewrites the hashed name,
argo/kustomizeconfig.yaml), so a Workflow submitted without the controller (`argo submit`) fails at once
on an unknown pool, with the list, rather than leaving a GPU step Pending for a node that no pool has.
An `enum` on the parameter would not do it: Argo validates a Workflow that references a template with
the Workflow's own parameters first (util.MergeParameters in workflow/validate/validate.go, v3.7), so a
template's enum never reaches a value passed with `-p`; and the pools differ per overlay.

Build-time only: Hera is a `dev` dependency, neither image needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hera.workflows import Container, CronWorkflow, Steps, WorkflowTemplate
from hera.workflows import Step as ArgoStep
from hera.workflows import models as m
from hera.workflows.protocol import Templatable

from contracts.pipeline import BENCH_STEP, PIPELINE, Graph, Node, Pipeline, Resources, Retry, Step, When
from service.backends.argo_parameters import PARAMETERS, pool_convention

ARGO_DIR = Path(__file__).resolve().parent


def param(name: str) -> str:
    """An Argo reference to the workflow parameter `name`."""
    return f"{{{{workflow.parameters.{name}}}}}"


def input_param(name: str) -> str:
    """An Argo reference to the template's input parameter `name`."""
    return f"{{{{inputs.parameters.{name}}}}}"


# The trainer image's ENTRYPOINT (Dockerfile, target trainer), written out so the args below are the
# trainer's arguments whatever the image's entrypoint becomes.
TRAINER_COMMAND = ["python", "-m", "trainer"]
TRAINER_IMAGE = f"foxhunt-trainer:{param('commit-sha')}"
MAIN_CONTAINER = "main"  # Argo's name for a template's container; the pod spec patch merges on it
METRICS_PORT = 9400
SERVICE_ACCOUNT = "foxhunt-workflow"
CONFIG_FILE = "/inputs/config.json"  # the config parameter as a raw input artifact (resolve's input)
POOLS_DIR = "/etc/foxhunt/pools"  # the foxhunt-pools ConfigMap (the controller's FOXHUNT_POOLS_FILE)
POOLS_CONFIG_MAP, POOLS_KEY = "foxhunt-pools", "pools.yaml"
PARALLELISM = m.ConfigMapKeySelector(name="foxhunt-workflow-limits", key="hyperopt-parallelism")

# The pipeline's placeholders (contracts/pipeline.py) as Argo binds them; those a node binds itself
# (train's config_file, a fan-out's trial) become its template's input parameters.
BINDINGS: dict[str, str] = {
    "config": CONFIG_FILE,
    "job_id": param("job-id"),
    "commit": param("commit-sha"),
    "model": param("model"),
    "train_epochs": param("train-epochs"),
    "pool": param("gpu-pool"),
    "pools": f"{POOLS_DIR}/{POOLS_KEY}",
    "run": f"/data/runs/{param('job-id')}",
    "checkpoints": f"/data/checkpoints/{param('job-id')}",
    "storage": "$(FOXHUNT_OPTUNA_STORAGE)",
    "study": f"foxhunt-{param('job-id')}",
    "trials": param("hyperopt-trials"),
    "status": "{{workflow.status}}",
    "duration": "{{workflow.duration}}",
    "failures": "{{workflow.failures}}",
}

# One GPU of the cluster's default resource: what a GPU step gets when nobody passes a placement; the step's
# own nodeSelector and tolerations (POOL_SELECTOR, POOL_TOLERATIONS) place it on the gpu-pool's nodes.
DEFAULT_POD_SPEC_PATCH = json.dumps(
    {
        "containers": [
            {
                "name": MAIN_CONTAINER,
                "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
            }
        ]
    },
    separators=(",", ":"),
    sort_keys=True,
)
# Every GPU step's placement before its pod spec patch: the gpu-pool's nodes, by their label and taints.
_CONVENTION = pool_convention(param("gpu-pool"))
POOL_SELECTOR: dict[str, str] = _CONVENTION[0]
POOL_TOLERATIONS = [
    m.Toleration(key=t["key"], operator=t["operator"], value=t.get("value"), effect=t["effect"]) for t in _CONVENTION[1]
]
# Defaults of compile-and-train's parameters; the controller always passes every one.
PARAMETER_DEFAULTS: dict[str, str] = {
    # A Workflow submitted by hand (`argo submit --from workflowtemplate/...`) is its own job: its name
    # (Argo substitutes {{workflow.name}} in a parameter's default; checked on the test cluster).
    "job-id": "{{workflow.name}}",
    "queue-name": "",
    "hyperopt-trials": "0",
    "model": "dqn",
    "train-epochs": "0",
    "config": "{}",
    "pod-spec-patch": DEFAULT_POD_SPEC_PATCH,
    "progress-token": "",
}

# CPU and memory of each step class (GPUs come from the pod spec patch). The tiny steps import the
# trainer package (torch included), which alone takes about 250 MiB.
RESOURCES: dict[Resources, m.ResourceRequirements] = {
    "gpu": m.ResourceRequirements(
        requests={"cpu": m.Quantity(__root__="4"), "memory": m.Quantity(__root__="24Gi")},
        limits={"memory": m.Quantity(__root__="48Gi")},
    ),
    "cpu": m.ResourceRequirements(
        requests={"cpu": m.Quantity(__root__="250m"), "memory": m.Quantity(__root__="512Mi")},
        limits={"memory": m.Quantity(__root__="2Gi")},
    ),
    "tiny": m.ResourceRequirements(
        requests={"cpu": m.Quantity(__root__="100m"), "memory": m.Quantity(__root__="512Mi")},
        limits={"memory": m.Quantity(__root__="1Gi")},
    ),
}

# Infrastructure failures only: Argo's Error phase (node lost, pod deleted or preempted) and exit 143
# (SIGTERM from a drain or spot reclaim, after a last checkpoint). The trainer's own non-zero exits
# (1, 2) are the job's failure and are not retried.
INFRASTRUCTURE_ONLY = (
    "lastRetry.status == 'Error' || (lastRetry.status == 'Failed' && asInt(lastRetry.exitCode) == 143)"
)


def int_or_string(value: int) -> m.IntOrString:
    """An IntOrString field, written as a string: Argo's JSON schema (schema.json) types them so."""
    return m.IntOrString(__root__=str(value))


def retry_strategy(retry: Retry, *, limit: int, backoff: tuple[str, int, str]) -> m.RetryStrategy:
    """A step's retry policy; `backoff` is (first delay, factor, longest total)."""
    duration, factor, max_duration = backoff
    policy = m.Backoff(duration=duration, factor=int_or_string(factor), max_duration=max_duration)
    if retry == "on-error":
        return m.RetryStrategy(limit=int_or_string(limit), retry_policy="OnError", backoff=policy)
    return m.RetryStrategy(
        limit=int_or_string(limit),
        retry_policy="Always",
        expression=INFRASTRUCTURE_ONLY,
        backoff=policy,
        # A retry lands on another node: the one that failed may be the cause.
        affinity=m.RetryAffinity(node_anti_affinity=m.RetryNodeAntiAffinity()),
    )


PIPELINE_RETRY: dict[Retry, m.RetryStrategy] = {
    "infrastructure": retry_strategy("infrastructure", limit=3, backoff=("30s", 2, "30m")),
    "on-error": retry_strategy("on-error", limit=2, backoff=("10s", 2, "5m")),
}

POD_SECURITY = m.PodSecurityContext(
    run_as_non_root=True,
    run_as_user=10001,
    run_as_group=10001,
    fs_group=10001,
    seccomp_profile=m.SeccompProfile(type="RuntimeDefault"),
)
CONTAINER_SECURITY = m.SecurityContext(
    allow_privilege_escalation=False,
    read_only_root_filesystem=True,
    capabilities=m.Capabilities(drop=["ALL"]),
)
VOLUMES = [
    m.Volume(name="data", persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(claim_name="foxhunt-data")),
    m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource()),
]
MOUNTS = [m.VolumeMount(name="data", mount_path="/data"), m.VolumeMount(name="tmp", mount_path="/tmp")]
# Optional: without the ConfigMap the pod still starts, and resolve fails with "pools file not found".
POOLS_VOLUME = m.Volume(name="pools", config_map=m.ConfigMapVolumeSource(name=POOLS_CONFIG_MAP, optional=True))
POOLS_MOUNT = m.VolumeMount(name="pools", mount_path=POOLS_DIR, read_only=True)
METRICS_PORTS = [m.ContainerPort(name="metrics", container_port=METRICS_PORT, protocol="TCP")]
POD_GC = m.PodGC(strategy="OnPodCompletion", delete_delay_duration="1h")  # failed pods stay an hour for logs
TTL = m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=604800)
APP_LABELS = {"app.kubernetes.io/name": "foxhunt-trainer"}


def env(name: str, value: str) -> m.EnvVar:
    return m.EnvVar(name=name, value=value)


def config_map_env(name: str, *, optional: bool) -> m.EnvVar:
    """`name` from the same key of the foxhunt-trainer-env ConfigMap."""
    ref = m.ConfigMapKeySelector(name="foxhunt-trainer-env", key=name, optional=optional or None)
    return m.EnvVar(name=name, value_from=m.EnvVarSource(config_map_key_ref=ref))


OPTUNA_STORAGE = m.EnvVar(
    name="FOXHUNT_OPTUNA_STORAGE",
    value_from=m.EnvVarSource(secret_key_ref=m.SecretKeySelector(name="foxhunt-optuna", key="storage-url")),
)
HOME = env("HOME", "/tmp")  # the root filesystem is read-only


def kernel_cache(below: str) -> list[m.EnvVar]:
    """Inductor and Triton caches on the shared volume, per pool (GPU type) and `below`."""
    root = f"/data/kernel-cache/{param('gpu-pool')}/{below}"
    return [env("TORCHINDUCTOR_CACHE_DIR", f"{root}/inductor"), env("TRITON_CACHE_DIR", f"{root}/triton")]


def input_name(placeholder: str) -> str:
    """A node-bound placeholder as its template's input parameter (Argo spells names with hyphens)."""
    return placeholder.replace("_", "-")


def step_env(step: Step, values: dict[str, str]) -> list[m.EnvVar]:
    """A pipeline step's environment: the pipeline's own (identity, checkpoint), then metrics and
    progress on GPU steps."""
    out = [env(name, value) for name, value in step.environment(values).items()]
    if step.resources == "gpu":
        out += [
            env("FOXHUNT_METRICS_PORT", str(METRICS_PORT)),
            config_map_env("FOXHUNT_PUSHGATEWAY_URL", optional=True),
            config_map_env("FOXHUNT_PROGRESS_URL", optional=True),
            env("FOXHUNT_PROGRESS_TOKEN", param("progress-token")),
            # Warmed by compile, reused by trials and train: same GPU type, same code.
            *kernel_cache(param("commit-sha")),
        ]
    if step.optuna:
        out.append(OPTUNA_STORAGE)
    return [*out, HOME]


def pod_labels(step: str, *, job: bool, queue: bool) -> dict[str, str]:
    labels = APP_LABELS | {"app.kubernetes.io/part-of": "foxhunt"}
    if job:
        labels["foxhunt.io/job-id"] = param("job-id")
    labels |= {"foxhunt.io/pool": param("gpu-pool"), "foxhunt.io/step": step}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = param("queue-name")
    return labels


def container(step: Step, **fields: Any) -> Container:
    """The template running `trainer <args>` for `step`, with `fields` (args, env, labels, retry_strategy,
    inputs, synchronization, …) as Hera names them. A GPU step is placed on the gpu-pool's nodes by
    convention, then by the pod spec patch over that (the pool's config, from the controller)."""
    gpu = step.resources == "gpu"
    common: dict[str, Any] = {
        "image": TRAINER_IMAGE,
        "image_pull_policy": "IfNotPresent",
        "command": TRAINER_COMMAND,
        "resources": RESOURCES[step.resources],
        "security_context": CONTAINER_SECURITY,
        "volume_mounts": MOUNTS,
    }
    if gpu:
        placement = {"node_selector": POOL_SELECTOR, "tolerations": POOL_TOLERATIONS, "ports": METRICS_PORTS}
        common |= placement | {"pod_spec_patch": param("pod-spec-patch")}
    deadline = int_or_string(step.deadline_seconds)
    return Container(name=step.name, active_deadline_seconds=deadline, **common | fields)


def pipeline_template(step: Step, pipeline: Pipeline) -> Container:
    """A pipeline step's template: the placeholders its nodes bind are its input parameters, the
    others are bound by BINDINGS."""
    used = step.placeholders()
    own = pipeline.node_inputs(step)
    values = BINDINGS | {name: input_param(input_name(name)) for name in own}
    parameters = [m.Parameter(name=input_name(name)) for name in own]
    artifacts = [m.Artifact(name="config", path=CONFIG_FILE, raw=m.RawArtifact(data=param("config")))]
    inputs = m.Inputs(parameters=parameters or None, artifacts=artifacts if "config" in used else None)
    fanned = any(node.fan_out for node in pipeline.nodes_running(step))
    semaphore = m.SemaphoreRef(config_map_key_ref=PARALLELISM)
    return container(
        step,
        args=step.command(values),
        env=step_env(step, values),
        retry_strategy=PIPELINE_RETRY[step.retry],
        labels=pod_labels(step.name, job=True, queue=step.resources == "gpu"),
        inputs=inputs if inputs.parameters or inputs.artifacts else None,
        # Trials of every job share the pools: a semaphore in the foxhunt-workflow-limits ConfigMap
        # bounds how many run at once (Argo takes no `parallelism` from a parameter, argo-workflows#1780).
        synchronization=m.Synchronization(semaphores=[semaphore]) if fanned else None,
        volume_mounts=[*MOUNTS, POOLS_MOUNT] if "pools" in used else MOUNTS,
    )


def condition(when: When) -> str:
    """A node's condition as an Argo `when` over the workflow's parameters."""
    return f"{BINDINGS[when.placeholder]} {when.op} {when.value}"


def argo_step(node: Node) -> ArgoStep:
    """One node as a step of its graph's Steps template."""
    fields: dict[str, Any] = {"name": node.name, "template": node.run.name}
    arguments = [m.Parameter(name=input_name(name), value=value.format(**BINDINGS)) for name, value in node.bind]
    if node.when is not None:
        fields["when"] = condition(node.when)
    if node.fan_out is not None:
        # The source prints the items as a JSON list on stdout.
        fields["with_param"] = f"{{{{steps.{node.fan_out.source}.outputs.result}}}}"
        arguments.insert(0, m.Parameter(name=input_name(node.fan_out.item), value="{{item}}"))
        if node.fan_out.tolerate_failures:
            fields["continue_on"] = m.ContinueOn(failed=True)
    if arguments:
        fields["arguments"] = arguments
    return ArgoStep(**fields)


def steps_template(graph: Graph) -> Steps:
    """A graph as a Steps template: one parallel group per layer, in order."""
    groups = [[argo_step(node) for node in layer] for layer in graph.layers()]
    return Steps(name=graph.name, sub_steps=[group[0] if len(group) == 1 else group for group in groups])


def workflow_spec_fields() -> dict[str, Any]:
    """What every Workflow of ours shares: identity, lifecycle bounds, security and the shared volume."""
    return {
        "service_account_name": SERVICE_ACCOUNT,
        "automount_service_account_token": False,
        "executor": m.ExecutorConfig(service_account_name=SERVICE_ACCOUNT),
        "pod_gc": POD_GC,
        "ttl_strategy": TTL,
        "security_context": POD_SECURITY,
        "volumes": VOLUMES,
    }


def compile_and_train(pipeline: Pipeline = PIPELINE) -> WorkflowTemplate:
    """The job's WorkflowTemplate: a Steps template per graph, then a container template per step."""
    templates: list[m.Template | Templatable] = [steps_template(graph) for graph in pipeline.graph.graphs()]
    templates += [pipeline_template(step, pipeline) for step in pipeline.steps()]
    parameters = [
        m.Parameter(name=name, description=description, value=PARAMETER_DEFAULTS.get(name))
        for name, description in PARAMETERS.items()
    ]
    return WorkflowTemplate(
        name="compile-and-train",
        labels=APP_LABELS | {"app.kubernetes.io/component": "workflow"},
        entrypoint=pipeline.graph.name,
        on_exit=pipeline.on_exit.name,
        arguments=parameters,
        active_deadline_seconds=259200,  # a stuck job cannot hold GPUs for ever (3 days)
        templates=templates,
        **workflow_spec_fields() | {"volumes": [*VOLUMES, POOLS_VOLUME]},
    )


BENCH = BENCH_STEP
BENCH_BINDINGS = {
    "out": f"/data/bench/{param('gpu-pool')}/{{{{workflow.name}}}}",
    "pool": param("gpu-pool"),
    "commit": param("commit-sha"),
}
BENCH_PARAMETERS = {
    "gpu-pool": "Pool to benchmark: the foxhunt.io/pool label of its pods and the folder of its results.",
    "commit-sha": "Image tag of foxhunt-trainer (a commit sha, or `main` for the latest build of main).",
    "pod-spec-patch": (
        "The pool's placement as a pod spec patch (JSON) over the step's placement by gpu-pool (nodeSelector "
        "merged key by key, tolerations replaced whole, the GPU resource of the main container). The default "
        "only asks for one nvidia.com/gpu."
    ),
}
BENCH_DEFAULTS = {"commit-sha": "main", "pod-spec-patch": DEFAULT_POD_SPEC_PATCH}


def bench() -> WorkflowTemplate:
    """The benchmark: `trainer bench` on one GPU of a pool, run by operators and nightly."""
    template = container(
        BENCH,
        args=BENCH.command(BENCH_BINDINGS),
        env=[
            *(env(name, value) for name, value in BENCH.environment(BENCH_BINDINGS).items()),
            env("FOXHUNT_METRICS_PORT", str(METRICS_PORT)),
            # Required: a benchmark whose table reaches no dashboard is not worth the GPU time.
            config_map_env("FOXHUNT_PUSHGATEWAY_URL", optional=False),
            *kernel_cache("bench"),
            HOME,
        ],
        # A failing benchmark is a result, not something to hide behind a retry.
        retry_strategy=retry_strategy("infrastructure", limit=2, backoff=("1m", 2, "20m")),
        labels=pod_labels(BENCH.name, job=False, queue=False),
        image_pull_policy="Always",  # `main` moves
    )
    return WorkflowTemplate(
        name="foxhunt-bench",
        labels=APP_LABELS | {"app.kubernetes.io/component": "benchmark"},
        entrypoint=BENCH.name,
        arguments=[
            m.Parameter(name=name, description=description, value=BENCH_DEFAULTS.get(name))
            for name, description in BENCH_PARAMETERS.items()
        ],
        active_deadline_seconds=7200,
        templates=[template],
        **workflow_spec_fields(),
    )


# The nightly run's pool and placement; the overlays replace both (k8s/overlays/*/kustomization.yaml).
NIGHTLY_POOL = "h100"


def bench_nightly() -> CronWorkflow:
    """The nightly benchmark of the latest main build on one pool."""
    values = {"gpu-pool": NIGHTLY_POOL} | BENCH_DEFAULTS
    return CronWorkflow(
        name="foxhunt-bench-nightly",
        labels=APP_LABELS | {"app.kubernetes.io/component": "benchmark"},
        schedules=["0 3 * * *"],
        timezone="UTC",
        concurrency_policy="Forbid",
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=7,
        workflow_template_ref=m.WorkflowTemplateRef(name="foxhunt-bench"),
        arguments=[m.Parameter(name=name, value=values[name]) for name in BENCH_PARAMETERS],
    )


def nightly_document() -> dict[str, Any]:
    doc: dict[str, Any] = bench_nightly().to_dict()
    # Hera has no field for it: the labels of the Workflows the CronWorkflow creates.
    doc["spec"]["workflowMetadata"] = {"labels": APP_LABELS | {"app.kubernetes.io/component": "benchmark"}}
    return doc


HEADER = "# Generated from contracts/pipeline.py by argo/render.py (`make argo`): do not edit by hand.\n"

COMPILE_AND_TRAIN_NOTES = """\
# One training job, the pipeline of contracts/pipeline.py: resolve (what the job asks, on a CPU), compile
# (the job's plan on this GPU type, warming the kernel caches), an optional Optuna search fanned out as
# parallel pods (suggest, trials, best), the full training run, a report; the exit handler records the outcome.
# The controller submits Workflows with `workflowTemplateRef: {name: compile-and-train}` and passes
# only the parameters below (names fixed in service/backends/argo_parameters.py). resolve, a tiny CPU pod
# placed anywhere, checks `model`, `gpu-pool` (against the foxhunt-pools ConfigMap, mounted at
# /etc/foxhunt/pools) and `train-epochs` (refused with run.steps in the config), and writes the resolved
# config, epochs turned into run.steps, to /data/runs/<job-id>/config.json: the one carrier of plan, steps
# and seeds for every later step. A job that asks wrongly, or for a pool the controller does not know,
# fails there at once with the reason, before any GPU step waits for a node.
#
# Placement of the GPU steps (compile, hyperopt-trial, train):
# - by convention, from `gpu-pool`: nodeSelector {foxhunt.io/pool: <gpu-pool>} and tolerations
#   nvidia.com/gpu Exists NoSchedule and foxhunt.io/pool Equal <gpu-pool> NoSchedule, matching nodes
#   labelled foxhunt.io/pool=<pool> and tainted nvidia.com/gpu:NoSchedule and foxhunt.io/pool=<pool>:NoSchedule;
#   so `argo submit … -p gpu-pool=<pool>` without pod-spec-patch lands on that pool's nodes;
# - then `pod-spec-patch` (podSpecPatch), the pool's config from the controller, applied by Argo as a
#   Kubernetes strategic merge patch of the PodSpec: nodeSelector (a map) merges key by key (a null value
#   deletes a key); tolerations have no patch merge key in PodSpec, so a patch's tolerations list REPLACES
#   the template's (the controller sends the pool's full list); containers merge by name, so the entry
#   `main` adds the GPU resource beside the step's CPU and memory. The default patch only asks for one
#   nvidia.com/gpu. The cluster can run Argo with templateReferencing: Strict and a new pool needs no new
#   template.
#
# Paths on the shared `foxhunt-data` volume (ReadWriteMany), all fixed per job, never per pod or retry:
#   /data/checkpoints/<job-id>/train           FOXHUNT_CHECKPOINT_URL of the full run (retries resume)
#   /data/checkpoints/<job-id>/trial-<n>       one per hyper-parameter trial
#   /data/runs/<job-id>/...                    config.json, check/, hyperopt/best-config.json, train/,
#                                              status.json
#   /data/kernel-cache/<pool>/<commit-sha>/    Inductor + Triton caches: warmed by compile, reused by
#                                              trials and train (same GPU type, same code)
#
# Steps (each runs `python -m trainer <args>`):
"""

BENCH_NOTES = """\
# The benchmark: `python -m trainer bench` on one GPU of a pool. It runs every plan, writes bench.json
# under the shared volume and pushes the table to the Prometheus Pushgateway (FOXHUNT_PUSHGATEWAY_URL),
# so the dashboards show each plan's step time per commit and pool.
# Placed as compile-and-train's GPU steps are: on the gpu-pool's nodes by their label and taints
# (nodeSelector foxhunt.io/pool=<gpu-pool>; tolerations nvidia.com/gpu and foxhunt.io/pool=<gpu-pool>),
# then the pod-spec-patch parameter as a strategic merge patch (nodeSelector merged key by key, a
# tolerations list replacing the template's, containers merged by name; default: one nvidia.com/gpu).
# Run by hand on a pool whose nodes follow that convention:
#   argo submit -n foxhunt --from workflowtemplate/foxhunt-bench -p gpu-pool=h100 -p commit-sha=<sha>
# and nightly by the CronWorkflow in bench-nightly.yaml, with the pool's own placement.
"""

NIGHTLY_NOTES = """\
# Nightly benchmark of the latest main build on one pool, so a step-time regression shows on the
# dashboard the morning after it lands. Overlays set the pool and its placement
# (k8s/overlays/*/kustomization.yaml; a test checks the placement is the pool's from its pools.yaml).
"""


def step_notes(pipeline: Pipeline) -> str:
    """One comment paragraph per step: its name and what it does."""
    paragraphs = [
        textwrap.fill(f"{step.name}: {step.description}", 112, initial_indent="#   ", subsequent_indent="#     ")
        for step in pipeline.steps()
    ]
    return "\n".join(paragraphs) + "\n"


def name_first(node: Any) -> Any:
    """`node` with each mapping's `name` first, as people read Argo YAML; other keys keep Hera's order."""
    if isinstance(node, dict):
        keys = sorted(node, key=lambda key: key != "name")
        return {key: name_first(node[key]) for key in keys}
    if isinstance(node, list):
        return [name_first(item) for item in node]
    return node


def to_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(name_first(doc), sort_keys=False, width=120, allow_unicode=True)


def render(pipeline: Pipeline = PIPELINE) -> dict[str, str]:
    """File name under argo/ -> its text."""
    return {
        "compile-and-train.yaml": HEADER
        + COMPILE_AND_TRAIN_NOTES
        + step_notes(pipeline)
        + to_yaml(compile_and_train(pipeline).to_dict()),
        "bench.yaml": HEADER + BENCH_NOTES + to_yaml(bench().to_dict()),
        "bench-nightly.yaml": HEADER + NIGHTLY_NOTES + to_yaml(nightly_document()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m argo.render", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ARGO_DIR, help="Folder to write the YAML into (default argo/).")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a file is out of date.")
    options = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = options.out / name
        if options.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run `make argo`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
