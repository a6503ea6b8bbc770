"""An HTTP-level fake Kubernetes API server for testing the Argo backend through the real client."""

from tests.service.fake_kube.server import FakeKube

__all__ = ["FakeKube"]
