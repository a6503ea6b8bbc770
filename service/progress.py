"""Attempt-scoped progress tokens: how a trainer pod proves that its progress report is about its own job,
and about the attempt that runs now.

token = "<attempt>." + hex(HMAC-SHA256(FOXHUNT_PROGRESS_SECRET, job id NUL attempt)). The Argo backend
passes it to the attempt's Workflow as the `progress-token` parameter; `PUT /v1/jobs/{id}/progress`
recomputes it and the store takes the report only if that attempt is still the job's current one. A
retry's Workflow gets a new token, and the previous attempt's pods (still stopping, or orphaned) are
refused: they cannot write their figures over the new attempt's. Nothing is stored, so every controller
replica (and a restarted one) accepts the tokens of running Workflows as long as they share the secret.
Anyone who can read the Workflow can report progress for that attempt of that job and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac


def progress_token(secret: str, job_id: str, attempt: int = 0) -> str:
    """The progress token of one attempt (0: the first run; each retry adds one) of a job under `secret`."""
    digest = hmac.new(secret.encode(), f"{job_id}\0{attempt}".encode(), hashlib.sha256).hexdigest()
    return f"{attempt}.{digest}"


def token_attempt(secret: str, job_id: str, token: str) -> int | None:
    """The attempt `token` is the progress token of, for this job; None if it is not one (constant-time
    comparison of the digest)."""
    prefix, dot, _ = token.partition(".")
    if not dot or not prefix.isascii() or not prefix.isdigit() or len(prefix) > 10:
        return None
    attempt = int(prefix)
    if not hmac.compare_digest(progress_token(secret, job_id, attempt).encode(), token.encode()):
        return None
    return attempt
