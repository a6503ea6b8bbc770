"""The parameters the controller passes to the `compile-and-train` WorkflowTemplate, named once.

`argo/render.py` declares exactly `PARAMETERS` in the rendered template, so a name exists once and the
two sides cannot drift. Only what Argo itself needs travels as a parameter, plus what a job asks
beside its config (`model`, `train-epochs`): the compile step checks those and writes the resolved
config (epochs turned into run.steps there and nowhere else), the one carrier of everything the
later steps read (plan, steps, seeds).
"""

from __future__ import annotations

import json

from service.domain import JobSpec
from trainer.config import MODELS, STEPS_PER_EPOCH

# name -> description (rendered into the WorkflowTemplate)
PARAMETERS: dict[str, str] = {
    "job-id": "The controller's job id; names the run directory, checkpoints and Optuna study.",
    "commit-sha": "Git commit of the trainer; the image tag of foxhunt-trainer.",
    "gpu-pool": (
        "The pool the job runs on, one of the controller's pools file (compile fails the job otherwise, listing "
        "them); recorded on its pods as the foxhunt.io/pool label."
    ),
    "queue-name": "Kueue LocalQueue of the pool; empty when the pool names none.",
    "hyperopt-trials": "Optuna trials before the full run; 0 skips the search.",
    "model": f"The model to train: {', '.join(MODELS)}; compile fails the job on any other.",
    "train-epochs": (
        f"The run's length in epochs of {STEPS_PER_EPOCH} steps: compile sets run.steps to epochs x "
        f"{STEPS_PER_EPOCH} and fails the job if the config sets run.steps too. 0: the config's run.steps."
    ),
    "config": (
        "The job's TrainConfig as JSON: with train-epochs, every setting but run.steps; compile writes the "
        "resolved config that every later step reads (plan, steps, seeds)."
    ),
    "pod-spec-patch": (
        "The pool's placement as a pod spec patch (JSON): nodeSelector, tolerations and the GPU resource "
        "of the main container, applied to every GPU step through podSpecPatch."
    ),
    "progress-token": "Job-scoped token with which the trainer reports progress to the controller.",
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
