"""Domain errors: raised by the store and the job service, mapped to problem+json once in api/errors.py."""

from __future__ import annotations


class DomainError(Exception):
    """Base of errors a client caused or can act on; the message is one line."""


class JobNotFound(DomainError):
    """No such job, or not visible to this tenant (the two are indistinguishable on purpose)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class IdempotencyConflict(DomainError):
    """The idempotency key (or job name) was used before with a different request body."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"idempotency key already used for job {job_id} with a different request")
        self.job_id = job_id


class InvalidTransition(DomainError):
    """The job is in a state that does not allow this action (e.g. retrying a running job)."""


class QuotaExceeded(DomainError):
    """The tenant's GPU quota on the pool would be exceeded."""


class UnknownPool(DomainError):
    """The job names a pool that is not configured."""


class DatasetNotAllowed(DomainError):
    """The job names a dataset outside the controller's dataset roots and schemes, or one it may not read."""


class SettingNotAllowed(DomainError):
    """The job's config sets a field that only the operator sets (`run.pushgateway_url`)."""


class InvalidRequest(DomainError):
    """A request that is well-formed but cannot be used (bad cursor, bad label selector)."""


class Unauthorized(DomainError):
    """Missing, unknown or revoked bearer token."""


class Forbidden(DomainError):
    """Authenticated, but the role does not allow this."""


class BodyTooLarge(DomainError):
    """The request body is longer than the controller reads (FOXHUNT_MAX_BODY_BYTES)."""


class BodyTimeout(DomainError):
    """The request body did not arrive in time (FOXHUNT_BODY_TIMEOUT_SECONDS): a stalled client."""


class ServiceUnavailable(DomainError):
    """A dependency of the controller (the database) does not answer."""
