"""The rendered Argo objects, and the Argo schemas of tests/deploy (from the Argo module, tests/upstream.py)."""

from __future__ import annotations

import pytest
import yaml

from argo.render import render
from tests.deploy.conftest import Doc, argo_crds, argo_json_schema

__all__ = ["argo_crds", "argo_json_schema"]


@pytest.fixture(scope="session")
def rendered_argo() -> dict[str, Doc]:
    """Each object `argo.render` renders, by name (parsed from the text it would write)."""
    docs = [yaml.safe_load(text) for text in render().values()]
    return {doc["metadata"]["name"]: doc for doc in docs}
