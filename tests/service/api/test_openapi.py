"""Schemathesis against the app's own OpenAPI document: no 5xx, every response matches its schema."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from service.app import create_app
from service.auth import create_token
from tests.service.factories import make_settings


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The app without the reconciler (generated jobs are stored, never run) and a token for it."""
    config = make_settings(tmp_path_factory.mktemp("openapi"), run_reconciler=False)
    app = create_app(config)
    secret, _ = create_token(app.state.services.store, name="fuzz", tenant="team-a")
    _token["secret"] = secret
    return schemathesis.openapi.from_asgi("/openapi.json", app)


_token: dict[str, str] = {}
schema = schemathesis.pytest.from_fixture("api")


@schema.auth()
class BearerToken:
    """Lets schemathesis send the valid token, and also try invalid ones (which must get 401)."""

    def get(self, case: schemathesis.Case, context: schemathesis.AuthContext) -> str:
        return _token["secret"]

    def set(self, case: schemathesis.Case, data: str, context: schemathesis.AuthContext) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:
    if case.query and "cursor" in case.query:
        # a cursor is opaque: only values the API handed out are valid, which no schema can say;
        # bad cursors (400) are tested in tests/service/api/routes/test_jobs.py
        del case.query["cursor"]
    # positive_data_acceptance is off: TrainConfig has cross-field rules (batch_size <= capacity,
    # v_min < v_max, heads divide attn_dim, budgets sum <= 1) that JSON Schema cannot state, so a
    # schema-valid body can rightly get 422. Every other default check runs.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


def test_every_error_is_documented_as_problem_json(api: Any) -> None:
    document = api.raw_schema
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                if code[0] in "45":
                    assert list(response["content"]) == ["application/problem+json"], (method, path, code)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert document["paths"]["/v1/jobs"]["post"]["operationId"] == "jobs-submit_job"
