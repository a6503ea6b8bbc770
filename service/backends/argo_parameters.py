"""The parameters the controller passes to the `compile-and-train` WorkflowTemplate, named once.

`argo/compile-and-train.yaml` declares exactly `PARAMETER_NAMES` (a test on that side checks it), so
renaming one here or there fails CI instead of a job at submission time on the cluster.
"""

from __future__ import annotations

import json

from service.domain import JobSpec

PARAMETER_NAMES: tuple[str, ...] = (
    "job-id",
    "commit-sha",
    "model",
    "plan",
    "gpu-pool",
    "queue-name",
    "train-epochs",
    "hyperopt-trials",
    "config",
)


def workflow_parameters(spec: JobSpec) -> list[dict[str, str]]:
    """`spec.arguments.parameters` of the job's Workflow: every value a string, as Argo requires."""
    values = {
        "job-id": spec.job_id,
        "commit-sha": spec.commit_sha,
        "model": spec.model,
        "plan": spec.plan,
        "gpu-pool": spec.pool,
        "queue-name": spec.queue_name or "",
        "train-epochs": str(spec.epochs),
        "hyperopt-trials": str(spec.hyperopt_trials),
        "config": json.dumps(spec.config, separators=(",", ":"), sort_keys=True),
    }
    return [{"name": name, "value": values[name]} for name in PARAMETER_NAMES]
