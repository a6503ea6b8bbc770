"""argo/render.py: the committed YAML is what the pipeline renders, it validates, and every container
command, with its parameters substituted as the Argo backend sends them, parses with the trainer CLI."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer.main
from typer.exceptions import TyperException

from argo import render
from contracts.config import load_config
from contracts.pipeline import (
    BEST_STEP,
    CHECK_STEP,
    EXIT_STEP,
    PIPELINE,
    RESOLVE_STEP,
    SUGGEST_STEP,
    TRAIN_STEP,
    TRIAL_STEP,
    Node,
    Step,
)
from service.backends.argo import pod_spec_patch
from service.backends.argo_parameters import PARAMETER_NAMES, workflow_parameters
from service.domain import JobSpec, Placement
from service.pools import Pools
from service.progress import progress_token
from tests.deploy.conftest import ARGO_DIR, K8S_DIR, ROOT, Doc
from trainer.cli import app
from trainer.tools.hyperopt import parse_pack

JOB = "j-7f3a9c"
POOL = "h100"
COMMIT = "0123abcd"
SECRET = "s" * 32
TRIALS = 3
OPTUNA_STORAGE = "postgresql+psycopg://optuna:pw@optuna-db:5432/optuna"
# What a cluster holds for the env the templates read from a Secret or a ConfigMap.
SECRETS = {("foxhunt-optuna", "storage-url"): OPTUNA_STORAGE}
CONFIG_MAPS = {
    ("foxhunt-trainer-env", "FOXHUNT_PUSHGATEWAY_URL"): "http://pushgateway.monitoring:9091",
    ("foxhunt-trainer-env", "FOXHUNT_PROGRESS_URL"): "http://foxhunt-controller.foxhunt:8000",
}
# Argo's own variables at the moment a step runs, and the outputs `withParam` iterates over.
WORKFLOW_VARIABLES = {
    "workflow.name": JOB,
    "workflow.status": "Failed",
    "workflow.duration": "812.402",
    "workflow.failures": '[{"displayName":"train","message":"OOMKilled","templateName":"train","phase":"Failed"}]',
}
# suggest's packs of trials (trainer hyperopt suggest): a pack of several, and a trial alone (a shape it searched)
PACKS = [",".join(str(n) for n in range(TRIALS - 1)), str(TRIALS - 1)]
STEP_OUTPUTS = {"{{steps.suggest.outputs.result}}": json.dumps(PACKS)}
# The pipeline's placeholders as they read inside a pod of job JOB (contracts/pipeline.py, issue 10).
POD_VALUES = {
    "config": "/inputs/config.json",
    "model": "dqn",
    "train_epochs": "0",
    "pool": POOL,
    "pools": "/etc/foxhunt/pools/pools.yaml",
    "run": f"/data/runs/{JOB}",
    "checkpoints": f"/data/checkpoints/{JOB}",
    "storage": OPTUNA_STORAGE,
    "study": f"foxhunt-{JOB}",
    "trials": str(TRIALS),
    "status": WORKFLOW_VARIABLES["workflow.status"],
    "duration": WORKFLOW_VARIABLES["workflow.duration"],
    "failures": WORKFLOW_VARIABLES["workflow.failures"],
}
ARGO_REFERENCE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class CommandRejected(AssertionError):
    """The trainer CLI does not accept a container's arguments."""


def h100_job() -> JobSpec:
    """A job as the API builds it: the h100 pool's placement, a real resolved config, a search."""
    pool = Pools.load(K8S_DIR / "overlays" / POOL / "pools.yaml").get(POOL)
    config = load_config(ROOT / "examples" / "cartpole.yaml", ["run.plan=graph", "run.steps=500"])
    return JobSpec(
        job_id=JOB,
        tenant="research",
        pool=POOL,
        queue_name=pool.queue_name,
        placement=pool.placement(),
        plan="graph",
        model="dqn",
        commit_sha=COMMIT,
        epochs=1,
        hyperopt_trials=TRIALS,
        config=config.model_dump(mode="json"),
    )


def sent_parameters(spec: JobSpec) -> dict[str, str]:
    """The Workflow's parameters exactly as the Argo backend sends them for `spec`."""
    parameters = workflow_parameters(
        spec, pod_spec_patch=pod_spec_patch(spec.placement), progress_token=progress_token(SECRET, spec.job_id)
    )
    return {p["name"]: p["value"] for p in parameters}


def substitute(text: str, values: dict[str, str]) -> str:
    """Argo's `{{…}}` substitution; an unknown reference fails (Argo would leave it or reject the template)."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise AssertionError(f"unresolved Argo reference {match.group(0)} in {text!r}")
        return values[match.group(1)]

    return ARGO_REFERENCE.sub(one, text)


def invocations(doc: Doc, parameters: dict[str, str]) -> Iterator[tuple[str, Doc, dict[str, str]]]:
    """(template name, template, Argo variables) of each pod the Workflow could run, every step-call
    followed from the entrypoint and exit handler with its arguments and `withParam` items resolved."""
    spec = doc["spec"]
    templates = {t["name"]: t for t in spec["templates"]}
    declared = {p["name"]: p.get("value") for p in spec["arguments"]["parameters"]}
    values = declared | parameters
    missing = sorted(name for name, value in values.items() if value is None)
    assert not missing, f"{doc['metadata']['name']}: no value for parameters {missing}"
    variables = {f"workflow.parameters.{name}": str(value) for name, value in values.items()} | WORKFLOW_VARIABLES

    def visit(name: str, inputs: dict[str, str]) -> Iterator[tuple[str, Doc, dict[str, str]]]:
        template = templates[name]
        if "steps" not in template:
            wanted = {p["name"] for p in template.get("inputs", {}).get("parameters", [])}
            assert set(inputs) == wanted, f"{name} is called with {sorted(inputs)}, takes {sorted(wanted)}"
            yield name, template, variables | {f"inputs.parameters.{k}": v for k, v in inputs.items()}
            return
        for group in template["steps"]:
            for step in group:
                items = json.loads(STEP_OUTPUTS[step["withParam"]]) if "withParam" in step else [None]
                for item in items:
                    local = variables if item is None else variables | {"item": str(item)}
                    arguments = step.get("arguments", {}).get("parameters", [])
                    yield from visit(step["template"], {a["name"]: substitute(a["value"], local) for a in arguments})

    yield from visit(spec["entrypoint"], {})
    if "onExit" in spec:
        yield from visit(spec["onExit"], {})


def env_values(container: Doc, variables: dict[str, str]) -> dict[str, str]:
    """The container's environment on the cluster: values substituted, Secret and ConfigMap keys read."""
    out: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            out[entry["name"]] = substitute(entry["value"], variables)
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            out[entry["name"]] = SECRETS[(ref["name"], ref["key"])]
        else:
            ref = entry["valueFrom"]["configMapKeyRef"]
            out[entry["name"]] = CONFIG_MAPS[(ref["name"], ref["key"])]
    return out


def pod_args(template: Doc, variables: dict[str, str]) -> list[str]:
    """The trainer arguments the pod runs: Argo's substitution, then Kubernetes' `$(VAR)` expansion."""
    container = template["container"]
    assert container["command"] == render.TRAINER_COMMAND, template["name"]
    env = env_values(container, variables)

    def expand(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"{template['name']}: $({match.group(1)}) is not in the container's env"
        return env[match.group(1)]

    return [ENV_REFERENCE.sub(expand, substitute(arg, variables)) for arg in container["args"]]


def parse(cli: Any, args: list[str]) -> dict[str, Any]:
    """Parse `args` with the trainer CLI (its Click objects, Typer's vendored Click), running nothing."""
    node, rest = cli, list(args)
    while rest and rest[0] in getattr(node, "commands", {}):
        node = node.commands[rest.pop(0)]
    if hasattr(node, "commands"):
        raise CommandRejected(f"{args!r} names no trainer command")
    try:
        return dict(node.make_context(node.name, rest).params)
    except TyperException as error:
        raise CommandRejected(f"the trainer CLI rejects {args!r}: {error}") from error


def trainer_cli() -> Any:
    return typer.main.get_command(app)


def all_pods(rendered_argo: dict[str, Doc]) -> list[tuple[str, Doc, dict[str, str]]]:
    """Every pod of compile-and-train for the h100 job, and of the nightly benchmark."""
    pods = list(invocations(rendered_argo["compile-and-train"], sent_parameters(h100_job())))
    nightly = rendered_argo["foxhunt-bench-nightly"]["spec"]["workflowSpec"]["arguments"]["parameters"]
    pods += invocations(rendered_argo["foxhunt-bench"], {p["name"]: p["value"] for p in nightly})
    return pods


# ---- the committed files ----------------------------------------------------------------------
def test_the_committed_yaml_is_what_the_pipeline_renders() -> None:
    for name, text in render.render().items():
        path = ARGO_DIR / name
        assert path.is_file() and path.read_text() == text, f"argo/{name} is out of date: run `make argo`"


def test_check_mode_names_a_stale_file_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert render.main(["--out", str(tmp_path)]) == 0
    assert render.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "bench.yaml").write_text("# edited by hand\n")
    assert render.main(["--out", str(tmp_path), "--check"]) == 1
    assert "bench.yaml" in capsys.readouterr().err
    assert (tmp_path / "bench.yaml").read_text() == "# edited by hand\n"


def _errors(validator: jsonschema.protocols.Validator, doc: Doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in validator.iter_errors(doc)]


def test_every_rendered_object_validates_against_the_crd_and_the_json_schema(
    rendered_argo: dict[str, Doc], argo_json_schema: Doc, argo_crds: dict[tuple[str, str], Doc]
) -> None:
    assert sorted(rendered_argo) == ["compile-and-train", "foxhunt-bench", "foxhunt-bench-nightly"]
    top = jsonschema.Draft202012Validator(argo_json_schema)
    for name, doc in rendered_argo.items():
        crd = jsonschema.Draft7Validator(argo_crds[(doc["apiVersion"], doc["kind"])])
        assert not _errors(crd, doc), f"{name} fails the CRD schema: {_errors(crd, doc)}"
        assert not _errors(top, doc), f"{name} fails schema.json: {_errors(top, doc)}"


# ---- the command check -------------------------------------------------------------------------
def test_every_container_command_parses_with_the_trainer_cli(rendered_argo: dict[str, Doc]) -> None:
    cli = trainer_cli()
    pods = all_pods(rendered_argo)
    ran = {name for name, _, _ in pods}
    assert ran == {step.name for step in PIPELINE.steps()} | {"bench"}, ran
    for name, template, variables in pods:
        args = pod_args(template, variables)
        parse(cli, args)  # raises CommandRejected with the CLI's own message
        assert not any("{{" in a or "$(" in a for a in args), f"{name}: unresolved reference in {args}"


def test_the_parsed_commands_carry_the_jobs_values(rendered_argo: dict[str, Doc]) -> None:
    """Not only syntax: the values the trainer reads are the job's (run dir, study, trial, outcome)."""
    cli = trainer_cli()
    parsed: dict[str, list[dict[str, Any]]] = {}
    for name, template, variables in all_pods(rendered_argo):
        parsed.setdefault(name, []).append(parse(cli, pod_args(template, variables)))
    assert [p["trials"] for p in parsed[TRIAL_STEP.name]] == PACKS  # one pod per pack, its trials as suggest grouped
    assert [parse_pack(p["trials"]) for p in parsed[TRIAL_STEP.name]] == [list(range(TRIALS - 1)), [TRIALS - 1]]
    assert {str(p["run_dir"]) for p in parsed[TRIAL_STEP.name]} == {f"/data/runs/{JOB}/hyperopt"}  # trial-<n>/ each
    (suggest,) = parsed[SUGGEST_STEP.name]
    assert suggest["trials"] == TRIALS and suggest["storage"] == OPTUNA_STORAGE and suggest["study"] == f"foxhunt-{JOB}"
    (resolve,) = parsed[RESOLVE_STEP.name]
    assert str(resolve["config"]) == "/inputs/config.json" and resolve["model"] == "dqn"
    assert resolve["train_epochs"] == 0 and resolve["pool"] == POOL  # h100_job sets run.steps itself
    assert str(resolve["pools_file"]) == "/etc/foxhunt/pools/pools.yaml"
    assert str(resolve["out"]) == f"/data/runs/{JOB}/config.json"
    for name in (CHECK_STEP.name, SUGGEST_STEP.name, TRIAL_STEP.name, BEST_STEP.name):
        assert {str(p["config"]) for p in parsed[name]} == {f"/data/runs/{JOB}/config.json"}, name
    trains = parsed[TRAIN_STEP.name]
    assert {str(p["config"]) for p in trains} == {
        f"/data/runs/{JOB}/config.json",
        f"/data/runs/{JOB}/hyperopt/best-config.json",
    }
    assert all(p["resume"] and str(p["run_dir"]) == f"/data/runs/{JOB}/train" for p in trains)
    (finish,) = parsed[EXIT_STEP.name]
    assert finish["status"] == "Failed" and json.loads(finish["failures"])[0]["templateName"] == "train"
    (bench,) = parsed["bench"]
    assert str(bench["out"]) == f"/data/bench/{POOL}/{JOB}" and bench["device"] == "cuda"


def test_the_command_check_fails_when_a_trainer_option_is_renamed(rendered_argo: dict[str, Doc]) -> None:
    renamed = copy.deepcopy(trainer_cli())
    run_dir = next(p for p in renamed.commands["train"].params if p.name == "run_dir")
    run_dir.opts = ["--output-dir"]
    (_, template, variables) = next(p for p in all_pods(rendered_argo) if p[0] == TRAIN_STEP.name)
    args = pod_args(template, variables)
    parse(trainer_cli(), args)
    with pytest.raises(CommandRejected, match="No such option: --run-dir"):
        parse(renamed, args)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["train", "--bogus", "1"], "No such option"),
        (["hyperopt", "trial", "--trial", "1", "--storage", "s", "--study", "s"], "No such option: --trial"),
        (["finish", "--run", "/data/runs/j"], "Missing parameter: status"),
        (["hyperopt"], "names no trainer command"),
    ],
)
def test_the_parse_rejects_what_the_cli_rejects(args: list[str], why: str) -> None:
    with pytest.raises(CommandRejected, match=why):
        parse(trainer_cli(), args)


def test_a_reference_argo_cannot_resolve_fails_the_check() -> None:
    with pytest.raises(AssertionError, match=r"unresolved Argo reference \{\{workflow.parameters.plan\}\}"):
        substitute("run.plan={{workflow.parameters.plan}}", {"workflow.parameters.job-id": JOB})


# ---- the pipeline in the template --------------------------------------------------------------
def _pod_values(variables: dict[str, str]) -> dict[str, str]:
    pack = variables.get("inputs.parameters.pack")
    return POD_VALUES | ({"pack": pack} if pack is not None else {})


def test_every_pipeline_step_runs_with_the_pipelines_exact_arguments(rendered_argo: dict[str, Doc]) -> None:
    """Each pod's arguments are its step's `command()` with the pipeline's placeholders as a pod reads them;
    train runs from the resolved config, or (node train-best) from the search's best."""
    nodes: dict[str, list[Node]] = {}
    for _, node in PIPELINE.graph.walk():
        if isinstance(node.run, Step):
            nodes.setdefault(node.run.name, []).append(node)
    nodes[EXIT_STEP.name] = [Node("on-exit", EXIT_STEP)]
    by_name = {step.name: step for step in PIPELINE.steps()}
    seen: set[str] = set()
    for name, template, variables in invocations(rendered_argo["compile-and-train"], sent_parameters(h100_job())):
        args = pod_args(template, variables)
        expected = [by_name[name].command(node.values(_pod_values(variables))) for node in nodes[name]]
        assert args in expected, f"{name}: {args} is none of the pipeline's {expected}"
        seen.add(" ".join(args))
    for node in nodes[TRAIN_STEP.name]:  # both of train's calls
        assert " ".join(TRAIN_STEP.command(node.values(POD_VALUES))) in seen, node.name


def test_each_step_keeps_its_deadline_retry_and_checkpoint(rendered_argo: dict[str, Doc]) -> None:
    templates = {t["name"]: t for t in rendered_argo["compile-and-train"]["spec"]["templates"]}
    for step in PIPELINE.steps():
        template = templates[step.name]
        assert int(template["activeDeadlineSeconds"]) == step.deadline_seconds, step.name
        policy = template["retryStrategy"]["retryPolicy"]
        assert policy == ("Always" if step.retry == "infrastructure" else "OnError"), step.name
        env = {e["name"]: e.get("value") for e in template["container"]["env"]}
        if step.checkpoint:
            bound = step.checkpoint.format(checkpoints=f"/data/checkpoints/{JOB}", pack="0,1")
            values = {"workflow.parameters.job-id": JOB, "inputs.parameters.pack": "0,1"}
            assert substitute(env["FOXHUNT_CHECKPOINT_URL"], values) == bound, step.name
        else:
            assert "FOXHUNT_CHECKPOINT_URL" not in env, step.name
        assert ("FOXHUNT_OPTUNA_STORAGE" in env) == step.optuna, step.name


# ---- placement and progress --------------------------------------------------------------------
GPU_STEPS = {step.name for step in PIPELINE.steps() if step.resources == "gpu"}
# The seed's deploy command: `argo submit … -p commit-sha=… -p model=dqn -p gpu-pool=… -p hyperopt-trials=0
# -p train-epochs=5`, no pod-spec-patch (job-id bound here: the template declares no default for it).
SEED_PARAMETERS = {
    "job-id": JOB, "commit-sha": COMMIT, "model": "dqn", "gpu-pool": POOL, "hyperopt-trials": "0", "train-epochs": "5",
}  # fmt: skip
CONVENTION_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "foxhunt.io/pool", "operator": "Equal", "value": POOL, "effect": "NoSchedule"},
]


def strategic_merge(original: Any, patch: Any, field: str = "") -> Any:
    """Kubernetes' strategic merge patch, for the PodSpec fields a pod spec patch of ours sets (Argo applies
    podSpecPatch with strategicpatch.StrategicMergePatch(pod, patch, apiv1.PodSpec{})): a map merges key by
    key and a null value deletes the key; a list with a patch merge key (`containers`: name) merges by it;
    any other list (`tolerations`, which has none in PodSpec) is replaced by the patch's."""
    if isinstance(patch, dict):
        merged = dict(original) if isinstance(original, dict) else {}
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = strategic_merge(merged.get(key), value, key)
        return merged
    if field == "containers" and isinstance(original, list):
        by_name = {item["name"]: item for item in original}
        patched = {item["name"]: strategic_merge(by_name.get(item["name"]), item) for item in patch}
        return [patched.get(item["name"], item) for item in original] + [
            item for name, item in patched.items() if name not in by_name
        ]
    return copy.deepcopy(patch)


def pod_placement(template: Doc, variables: dict[str, str]) -> Doc:
    """Where Argo puts a step's pod: the template's nodeSelector, tolerations and main container's resources,
    Argo's variables substituted, then its podSpecPatch applied over them."""
    spec = {key: template[key] for key in ("nodeSelector", "tolerations") if key in template}
    spec["containers"] = [{"name": render.MAIN_CONTAINER, "resources": template["container"]["resources"]}]
    spec = json.loads(substitute(json.dumps(spec), variables))
    if "podSpecPatch" in template:
        spec = strategic_merge(spec, json.loads(substitute(template["podSpecPatch"], variables)))
    return spec


def placements(doc: Doc, parameters: dict[str, str]) -> dict[str, Doc]:
    """Each step's pod placement (by template name) of a Workflow of `doc` given `parameters`."""
    return {name: pod_placement(template, variables) for name, template, variables in invocations(doc, parameters)}


def test_gpu_steps_select_their_pool_by_convention_under_the_pod_spec_patch(rendered_argo: dict[str, Doc]) -> None:
    for doc in (rendered_argo["compile-and-train"], rendered_argo["foxhunt-bench"]):
        for template in (t for t in doc["spec"]["templates"] if "container" in t):
            name, container = template["name"], template["container"]
            assert "nvidia.com/gpu" not in json.dumps(container["resources"]), name
            if name in GPU_STEPS or name == "bench":
                assert template["nodeSelector"] == {"foxhunt.io/pool": "{{workflow.parameters.gpu-pool}}"}, name
                assert template["tolerations"] == [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {
                        "key": "foxhunt.io/pool",
                        "operator": "Equal",
                        "value": "{{workflow.parameters.gpu-pool}}",
                        "effect": "NoSchedule",
                    },
                ], name
                assert template["podSpecPatch"] == "{{workflow.parameters.pod-spec-patch}}", name
                assert {"name": "metrics", "containerPort": 9400, "protocol": "TCP"} in container["ports"], name
            else:  # CPU steps run on any node: resolve, above all, must never wait for the pool's
                assert not {"nodeSelector", "tolerations", "podSpecPatch", "affinity"} & set(template), name


def test_the_seeds_deploy_command_places_gpu_steps_on_the_pools_nodes(rendered_argo: dict[str, Doc]) -> None:
    """Without pod-spec-patch, GPU pods select the pool's label, tolerate its taints and ask one GPU."""
    pods = placements(rendered_argo["compile-and-train"], SEED_PARAMETERS)
    assert set(pods) == {step.name for step in PIPELINE.steps()}  # every step-call followed, `when` or not
    for name, pod in pods.items():
        (main,) = pod["containers"]
        requests, limits = main["resources"]["requests"], main["resources"]["limits"]
        if name in GPU_STEPS:
            assert pod["nodeSelector"] == {"foxhunt.io/pool": POOL}, name
            assert pod["tolerations"] == CONVENTION_TOLERATIONS, name
            assert requests["nvidia.com/gpu"] == limits["nvidia.com/gpu"] == "1", name
            assert requests["cpu"] == "4" and limits["memory"] == "48Gi", name  # the template's own CPU and memory
        else:
            assert "nodeSelector" not in pod and "tolerations" not in pod, name
            assert "nvidia.com/gpu" not in json.dumps(main), name
    bench = placements(rendered_argo["foxhunt-bench"], {"gpu-pool": POOL})["bench"]
    assert bench["nodeSelector"] == {"foxhunt.io/pool": POOL} and bench["tolerations"] == CONVENTION_TOLERATIONS


def test_with_the_controller_the_pools_own_placement_wins(rendered_argo: dict[str, Doc]) -> None:
    """The controller's patch over the template: the pods select exactly the pool's labels and tolerate exactly
    its taints (the patch's tolerations replace the template's), with the pool's GPUs."""
    spec = h100_job()
    pods = placements(rendered_argo["compile-and-train"], sent_parameters(spec))
    for name in GPU_STEPS:
        pod = pods[name]
        assert pod["nodeSelector"] == spec.placement.node_selector == {"foxhunt.io/pool": POOL}, name
        assert pod["tolerations"] == spec.placement.tolerations == CONVENTION_TOLERATIONS, name
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8", name
    other = Placement(
        node_selector={"cloud.google.com/gke-nodepool": "a3-h100"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        gpus=2,
    )
    pods = placements(rendered_argo["compile-and-train"], sent_parameters(spec.model_copy(update={"placement": other})))
    for name in GPU_STEPS:
        # The template's foxhunt.io/pool selector is deleted and its pool toleration replaced: the pool's config only.
        assert pods[name]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "a3-h100"}, name
        assert pods[name]["tolerations"] == other.tolerations, name
    anywhere = sent_parameters(spec.model_copy(update={"placement": Placement(gpus=1)}))
    pod = placements(rendered_argo["compile-and-train"], anywhere)[TRAIN_STEP.name]
    assert pod["nodeSelector"] == {} and pod["tolerations"] == []  # a pool that names no label or taint


def test_the_merge_model_follows_the_pod_spec_patch_rules() -> None:
    """The strategic merge above, on its own: a map by key (null deletes), containers by name, other lists whole."""
    original = {
        "nodeSelector": {"a": "1", "b": "2"},
        "tolerations": [{"key": "x"}, {"key": "y"}],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "4"}}}, {"name": "wait"}],
    }
    patch = {
        "nodeSelector": {"b": None, "c": "3"},
        "tolerations": [{"key": "z"}],
        "containers": [{"name": "main", "resources": {"requests": {"gpu": "1"}}}],
    }
    assert strategic_merge(original, patch) == {
        "nodeSelector": {"a": "1", "c": "3"},
        "tolerations": [{"key": "z"}],
        "containers": [{"name": "main", "resources": {"requests": {"cpu": "4", "gpu": "1"}}}, {"name": "wait"}],
    }


def test_the_default_pod_spec_patch_asks_one_gpu_for_the_main_container(rendered_argo: dict[str, Doc]) -> None:
    for name in ("compile-and-train", "foxhunt-bench"):
        parameters = {p["name"]: p for p in rendered_argo[name]["spec"]["arguments"]["parameters"]}
        patch = json.loads(parameters["pod-spec-patch"]["value"])
        (main,) = patch["containers"]
        assert main["name"] == "main"
        assert main["resources"]["requests"] == main["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_the_template_declares_exactly_the_controllers_parameters(rendered_argo: dict[str, Doc]) -> None:
    declared = [p["name"] for p in rendered_argo["compile-and-train"]["spec"]["arguments"]["parameters"]]
    assert declared == list(PARAMETER_NAMES)


def test_the_template_declares_model_and_train_epochs_for_compile(rendered_argo: dict[str, Doc]) -> None:
    """Argo's CLI passes `-p` names unchecked (argo-workflows#10482): the seed's own parameters must exist."""
    parameters = {p["name"]: p for p in rendered_argo["compile-and-train"]["spec"]["arguments"]["parameters"]}
    assert parameters["model"]["value"] == "dqn" and parameters["train-epochs"]["value"] == "0"
    assert "2000" in parameters["train-epochs"]["description"]


def test_the_seeds_deploy_command_reaches_resolve_as_it_says(rendered_argo: dict[str, Doc]) -> None:
    """`argo submit --from workflowtemplate/compile-and-train -p model=dqn -p train-epochs=5 …` with no
    controller: every other parameter at its default, resolve gets the model, the epochs and the pool."""
    cli = trainer_cli()
    pods = list(invocations(rendered_argo["compile-and-train"], SEED_PARAMETERS))
    (resolve,) = [parse(cli, pod_args(t, v)) for name, t, v in pods if name == RESOLVE_STEP.name]
    assert (resolve["model"], resolve["train_epochs"], resolve["pool"]) == ("dqn", 5, POOL)
    assert render.PARAMETER_DEFAULTS["config"] == "{}"  # the default config sets no run.steps: epochs can


def test_every_argo_submit_in_the_docs_passes_only_parameters_the_template_declares(
    rendered_argo: dict[str, Doc],
) -> None:
    """Argo drops an undeclared `-p` name without a word (argo-workflows#10482): the docs' commands must not."""
    commands = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = doc.read_text().replace("\\\n", " ")
        commands += [
            (doc.name, line) for line in text.splitlines() if "argo submit" in line and "workflowtemplate/" in line
        ]
    assert any("compile-and-train" in line for _, line in commands)
    for where, line in commands:
        template = re.search(r"--from workflowtemplate/([a-z0-9-]+)", line)
        assert template is not None and template.group(1) in rendered_argo, (where, line)
        declared = {p["name"] for p in rendered_argo[template.group(1)]["spec"]["arguments"]["parameters"]}
        passed = set(re.findall(r"-p ([A-Za-z0-9_-]+)=", line))
        assert passed and passed <= declared, (
            f"{where}: {sorted(passed - declared)} not declared by {template.group(1)}"
        )


def test_resolve_alone_reads_the_submitted_config_and_the_pools_file(rendered_argo: dict[str, Doc]) -> None:
    spec = rendered_argo["compile-and-train"]["spec"]
    (pools,) = [v for v in spec["volumes"] if v["name"] == "pools"]
    assert pools["configMap"] == {"name": "foxhunt-pools", "optional": True}  # optional: a missing one fails resolve
    for template in (t for t in spec["templates"] if "container" in t):
        mounts = {m["name"]: m for m in template["container"]["volumeMounts"]}
        artifacts = template.get("inputs", {}).get("artifacts", [])
        if template["name"] == RESOLVE_STEP.name:
            assert mounts["pools"] == {"name": "pools", "mountPath": "/etc/foxhunt/pools", "readOnly": True}
            assert [a["raw"]["data"] for a in artifacts] == ["{{workflow.parameters.config}}"]
        else:
            assert "pools" not in mounts and not artifacts, template["name"]


def test_gpu_steps_report_progress_with_the_jobs_token(rendered_argo: dict[str, Doc]) -> None:
    spec = h100_job()
    for name, template, variables in invocations(rendered_argo["compile-and-train"], sent_parameters(spec)):
        env = env_values(template["container"], variables)
        if name in {step.name for step in PIPELINE.steps() if step.resources == "gpu"}:
            assert env["FOXHUNT_PROGRESS_TOKEN"] == progress_token(SECRET, JOB), name
            assert env["FOXHUNT_PROGRESS_URL"] == CONFIG_MAPS[("foxhunt-trainer-env", "FOXHUNT_PROGRESS_URL")]
            assert env["FOXHUNT_JOB_ID"] == JOB and env["FOXHUNT_POOL"] == POOL and env["FOXHUNT_COMMIT"] == COMMIT
            assert env["FOXHUNT_METRICS_PORT"] == "9400", name
            assert env["TRITON_CACHE_DIR"] == f"/data/kernel-cache/{POOL}/{COMMIT}/triton", name
            refs = [e for e in template["container"]["env"] if e["name"] == "FOXHUNT_PROGRESS_URL"]
            assert refs[0]["valueFrom"]["configMapKeyRef"]["optional"] is True, name
        else:
            assert "FOXHUNT_PROGRESS_TOKEN" not in env, name


def test_the_trainer_image_runs_the_command_the_templates_name() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stage = dockerfile[dockerfile.index(" AS trainer") :]
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", stage, re.MULTILINE)
    assert entrypoint is not None
    assert json.loads(entrypoint.group(1)) == render.TRAINER_COMMAND
