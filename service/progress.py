"""Job-scoped progress tokens: how a trainer pod proves that its progress report is about its own job.

token = hex(HMAC-SHA256(FOXHUNT_PROGRESS_SECRET, job id)). The Argo backend passes it to the job's
Workflow as the `progress-token` parameter; `PUT /v1/jobs/{id}/progress` recomputes it. Nothing is
stored, so every controller replica (and a restarted one) accepts the tokens of running Workflows as
long as they share the secret. Anyone who can read the Workflow can report progress for that job
and no other: the token names one job and grants nothing else.
"""

from __future__ import annotations

import hashlib
import hmac


def progress_token(secret: str, job_id: str) -> str:
    """The job's progress token under `secret`."""
    return hmac.new(secret.encode(), job_id.encode(), hashlib.sha256).hexdigest()


def token_matches(secret: str, job_id: str, token: str) -> bool:
    """Whether `token` is the job's progress token (constant-time comparison)."""
    return hmac.compare_digest(progress_token(secret, job_id).encode(), token.encode())
