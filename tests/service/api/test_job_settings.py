"""Config fields that would have the trainer act for a tenant, through the real app: refused at submission (422).

`run.pushgateway_url` would have a job's trainer send HTTP requests to any address its pod reaches
(server-side request forgery): the Pushgateway is the operator's. A `data.env_id` of the form
`module:Name` would have Gymnasium import that module inside the trainer. Both are issue 29's; the
trainer refuses them too (tests/trainer/test_cli.py, tests/trainer/execution/data/).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.service.conftest import Controller
from tests.service.factories import make_settings


def _submit(c: Controller, **sections: dict[str, Any]) -> Any:
    config = {**sections, "run": {"steps": 2, **sections.get("run", {})}}
    return c.request("POST", "/v1/jobs", json={"config": config, "pool": "cpu"})


def _problem(response: Any, kind: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = response.json()
    assert problem["type"] == f"urn:foxhunt:problem:{kind}", problem
    return problem


@pytest.fixture
def controller(tmp_path: Path, controller_factory: Callable[[Settings], Controller]) -> Controller:
    return controller_factory(make_settings(tmp_path, run_reconciler=False))


def _nothing_stored(controller: Controller) -> None:
    assert controller.request("GET", "/v1/jobs", as_="root").json()["items"] == []


def test_a_job_may_not_name_the_pushgateway_its_trainer_sends_to(controller: Controller) -> None:
    for url in ("http://127.0.0.1:8000/v1/jobs", "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd"):
        problem = _problem(_submit(controller, run={"pushgateway_url": url}), "setting-not-allowed")
        assert problem["title"] == "Setting not allowed"
        assert problem["detail"].startswith("run.pushgateway_url is the operator's to set, not a job's")
        assert "FOXHUNT_PUSHGATEWAY_URL" in problem["detail"]
    _nothing_stored(controller)


def test_a_job_that_leaves_the_pushgateway_out_or_null_is_taken(controller: Controller) -> None:
    for run in ({}, {"pushgateway_url": None}):
        created = _submit(controller, run=run)
        assert created.status_code == 201, created.text
        assert created.json()["config"]["run"]["pushgateway_url"] is None


@pytest.mark.parametrize(
    "env_id",
    [
        "foxhunt_planted:Env",
        "os:system",
        "gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        "foxhunt/Market-v0:x",
        "ns:sub/CartPole-v1",
    ],
)
def test_a_module_qualified_env_id_is_refused(controller: Controller, env_id: str) -> None:
    problem = _problem(_submit(controller, data={"source": "gym", "env_id": env_id}), "validation")
    assert "config.data.env_id" in problem["detail"], problem
    assert "is module-qualified (module:Name): Gymnasium would import that module" in problem["detail"]
    _nothing_stored(controller)


@pytest.mark.parametrize(
    "env_id",
    ["", "../CartPole-v1", "CartPole v1", "Cart\u00e9Pole-v1", "a/b/c", "x" * 201],
    ids=["empty", "dot-dot", "space", "non-ascii", "two-slashes", "too-long"],
)
def test_an_env_id_not_of_a_registered_ids_form_is_refused(controller: Controller, env_id: str) -> None:
    problem = _problem(_submit(controller, data={"source": "gym", "env_id": env_id}), "validation")
    assert "is not a registered Gymnasium id: [namespace/]Name[-vN]" in problem["detail"], problem
    _nothing_stored(controller)


def test_registered_env_ids_are_still_taken(controller: Controller) -> None:
    for env_id in ("CartPole-v1", "foxhunt/Market-v0", "ALE/Pong-v5", "LunarLander-v3", "FrozenLake8x8-v1"):
        created = _submit(controller, data={"source": "gym", "env_id": env_id})
        assert created.status_code == 201, created.text
        assert created.json()["config"]["data"]["env_id"] == env_id
