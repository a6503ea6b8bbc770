"""The Kubernetes client configuration the controller uses, built once for the Argo backend and the leader election."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubernetes import client, config

if TYPE_CHECKING:
    from service.settings import Settings


def kube_configuration(settings: Settings) -> client.Configuration:
    """The kubeconfig file if the settings name one, the in-cluster service account otherwise.

    The client's own retries are off: each caller has its one retry layer. Raises OSError or
    ConfigException when neither can be loaded."""
    configuration = client.Configuration()
    if settings.kubeconfig:
        config.load_kube_config(config_file=str(settings.kubeconfig), client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.retries = 0
    return configuration
