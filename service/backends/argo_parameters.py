"""The parameters the controller passes to the `compile-and-train` WorkflowTemplate, named once.

`argo/render.py` declares exactly `PARAMETERS` in the rendered template, so a name exists once and the
two sides cannot drift. Only what Argo itself needs travels as a parameter: the resolved config is
the one carrier of everything the trainer reads (plan, steps, seeds), and no parameter overrides it.
"""

from __future__ import annotations

import json

from service.domain import JobSpec

# name -> description (rendered into the WorkflowTemplate)
PARAMETERS: dict[str, str] = {
    "job-id": "The controller's job id; names the run directory, checkpoints and Optuna study.",
    "commit-sha": "Git commit of the trainer; the image tag of foxhunt-trainer.",
    "gpu-pool": "The pool the job runs on; recorded on its pods as the foxhunt.io/pool label.",
    "queue-name": "Kueue LocalQueue of the pool; empty when the pool names none.",
    "hyperopt-trials": "Optuna trials before the full run; 0 skips the search.",
    "config": "The job's resolved TrainConfig as JSON: the only carrier of plan, steps and seeds.",
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
        "config": json.dumps(spec.config, separators=(",", ":"), sort_keys=True),
        "pod-spec-patch": pod_spec_patch,
        "progress-token": progress_token,
    }
    return [{"name": name, "value": values[name]} for name in PARAMETER_NAMES]
