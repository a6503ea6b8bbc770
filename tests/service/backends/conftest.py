"""Fixtures for the backend tests: a fake Kubernetes API server and an ArgoBackend pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from service.backends.argo import ArgoBackend
from tests.service.fake_kube import FakeKube


@pytest.fixture
def fake_kube() -> Iterator[FakeKube]:
    with FakeKube(namespace="foxhunt") as fake:
        yield fake


PROGRESS_SECRET = "progress-secret-of-the-tests-0123456789abcdef"


def kube_client(fake: FakeKube) -> client.ApiClient:
    """The real client, configured as from_settings does (no urllib3 retries: the backend retries)."""
    configuration = client.Configuration(host=fake.url)
    configuration.retries = 0
    return client.ApiClient(configuration)


def argo_backend(fake: FakeKube, **kwargs: float) -> ArgoBackend:
    options = {"backoff_seconds": 0.001, "max_backoff_seconds": 0.01, "poll_seconds": 0.05, **kwargs}
    return ArgoBackend(
        fake.namespace,
        kube_client(fake),
        progress_secret=PROGRESS_SECRET,
        request_timeout=5.0,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def argo(fake_kube: FakeKube) -> ArgoBackend:
    return argo_backend(fake_kube)
