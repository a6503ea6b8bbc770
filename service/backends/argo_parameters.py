"""The parameters the controller passes to the `compile-and-train` WorkflowTemplate, named once, and the
pool placement convention the template's GPU steps follow by default.

`argo/render.py` declares exactly `PARAMETERS` in the rendered template, so a name exists once and the
two sides cannot drift. Only what Argo itself needs travels as a parameter, plus what a job asks
beside its config (`model`, `train-epochs`): the resolve step checks those and writes the resolved
config (epochs turned into run.steps there and nowhere else), the one carrier of everything the
later steps read (plan, steps, seeds).
"""

from __future__ import annotations

import json

from contracts.config import MODELS, STEPS_PER_EPOCH
from service.domain import JobSpec

# By convention a pool's nodes carry the label POOL_LABEL=<pool> and the taints `nvidia.com/gpu:NoSchedule`
# and `POOL_LABEL=<pool>:NoSchedule` (k8s/overlays/*/pools.yaml, docs/deploy.md section 2).
POOL_LABEL = "foxhunt.io/pool"
GPU_TAINT = "nvidia.com/gpu"


def pool_convention(pool: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The nodeSelector and tolerations that place a pod on `pool`'s nodes by the convention above: what
    the template's GPU steps carry (with `pool` the gpu-pool parameter), under the pod spec patch."""
    return {POOL_LABEL: pool}, [
        {"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"},
        {"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"},
    ]


# name -> description (rendered into the WorkflowTemplate)
PARAMETERS: dict[str, str] = {
    "job-id": (
        "The controller's job id; names the run directory, checkpoints and Optuna study. "
        "Submitted by hand without it, the Workflow's own name."
    ),
    "commit-sha": "Git commit of the trainer; the image tag of foxhunt-trainer.",
    "gpu-pool": (
        "The pool the job runs on, one of the controller's pools file (resolve, the first step, fails the job "
        "otherwise, listing them); recorded on its pods as the foxhunt.io/pool label. GPU steps select nodes "
        "labelled foxhunt.io/pool=<pool> and tolerate the taints nvidia.com/gpu:NoSchedule and "
        "foxhunt.io/pool=<pool>:NoSchedule, unless pod-spec-patch says otherwise."
    ),
    "queue-name": "Kueue LocalQueue of the pool; empty when the pool names none.",
    "hyperopt-trials": "Optuna trials before the full run; 0 skips the search.",
    "model": f"The model to train: {', '.join(MODELS)}; resolve fails the job on any other.",
    "train-epochs": (
        f"The run's length in epochs of {STEPS_PER_EPOCH} steps: resolve sets run.steps to epochs x "
        f"{STEPS_PER_EPOCH} and fails the job if the config sets run.steps too. 0: the config's run.steps."
    ),
    "config": (
        "The job's TrainConfig as JSON: with train-epochs, every setting but run.steps; resolve writes the "
        "resolved config that every later step reads (plan, steps, seeds)."
    ),
    "pod-spec-patch": (
        "The pool's placement as a pod spec patch (JSON), applied to every GPU step through podSpecPatch, a "
        "strategic merge patch over the step's placement by gpu-pool: nodeSelector merges key by key (null "
        "deletes one), tolerations replace the step's list whole, and the entry of containers named main "
        "sets the GPU resource. The default only asks for one nvidia.com/gpu."
    ),
    "progress-token": "Attempt-scoped token with which the trainer reports progress to the controller.",
}
PARAMETER_NAMES: tuple[str, ...] = tuple(PARAMETERS)


def workflow_parameters(spec: JobSpec, *, pod_spec_patch: str, progress_token: str) -> list[dict[str, str]]:
    """`spec.arguments.parameters` of the job's Workflow: every value a string, as Argo requires."""
    values = {
        "job-id": spec.job_id,
        "commit-sha": spec.commit_sha,
        "gpu-pool": spec.pool,
        "queue-name": spec.queue_name or "",
        "hyperopt-trials": str(spec.hyperopt_trials),
        "model": spec.model,
        "train-epochs": str(spec.train_epochs or 0),
        "config": json.dumps(spec.config, separators=(",", ":"), sort_keys=True),
        "pod-spec-patch": pod_spec_patch,
        "progress-token": progress_token,
    }
    return [{"name": name, "value": values[name]} for name in PARAMETER_NAMES]
