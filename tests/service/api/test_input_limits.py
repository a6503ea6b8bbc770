"""Client input never makes a 5xx: every bad value is a problem+json 4xx and nothing is stored.

The regressions of issue 12's table, each run on SQLite and on PostgreSQL (the `database_url`
fixture), then a property-based test over request bodies and query strings made of the same values.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from service.app import create_app
from service.backends.local import LocalBackend
from service.settings import Settings
from tests.service.conftest import Controller
from tests.service.factories import make_settings

PROBLEM = "application/problem+json"
INT32_MAX = 2**31 - 1


@pytest.fixture
def c(tmp_path: Path, database_url: str, controller_factory: Callable[[Settings], Controller]) -> Controller:
    """A controller over each store; nothing runs jobs, so what is stored stays as the API left it."""
    return controller_factory(make_settings(tmp_path, database_url=database_url, run_reconciler=False))


def _stored(c: Controller) -> int:
    return len(c.services.store.list_jobs(limit=500)[0])


def _post_raw(c: Controller, raw: str) -> Any:
    return c.request("POST", "/v1/jobs", content=raw.encode(), headers={"content-type": "application/json"})


def _assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["detail"]
    return body


BAD_BODIES = {
    "steps 10^25": '{"pool": "cpu", "config": {"run": {"steps": 10000000000000000000000000}}}',
    "steps 1e400 as an integer": '{"pool": "cpu", "config": {"run": {"steps": 1' + "0" * 400 + "}}}",
    "steps past int32": '{"pool": "cpu", "config": {"run": {"steps": 4294967296000}}}',
    "seed past int64": '{"pool": "cpu", "config": {"run": {"seed": 9223372036854775808}}}',
    "learning_starts past int32": '{"pool": "cpu", "config": {"data": {"learning_starts": 2147483648}}}',
    "deadline before year 1 in UTC": '{"pool": "cpu", "deadline": "0001-01-01T00:00:00+01:00"}',
    "deadline after year 9999 in UTC": '{"pool": "cpu", "deadline": "9999-12-31T23:59:59-01:00"}',
    "NaN": '{"pool": "cpu", "config": {"model": {"v_min": NaN}}}',
    "Infinity": '{"pool": "cpu", "config": {"model": {"v_max": Infinity}}}',
    "-Infinity": '{"pool": "cpu", "config": {"loss": {"reward_scale": -Infinity}}}',
    "1e400": '{"pool": "cpu", "config": {"optim": {"max_grad_norm": 1e400}}}',
    "huge finite support": '{"pool": "cpu", "config": {"model": {"v_min": -1e308, "v_max": 1e308}}}',
    "NUL in model": '{"pool": "cpu", "model": "m\\u0000"}',
    "NUL in a config string": '{"pool": "cpu", "config": {"data": {"env_id": "CartPole\\u0000"}}}',
    "NUL in a dataset path": '{"pool": "cpu", "config": {"data": {"source": "offline", "dataset": "/x\\u0000"}}}',
    "empty pool": '{"pool": "", "config": {"run": {"steps": 2}}}',
    "NUL in pool": '{"pool": "cpu\\u0000"}',
}


@pytest.mark.parametrize("raw", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_values_in_a_submission_are_422_and_store_nothing(c: Controller, raw: str) -> None:
    body = _assert_problem(_post_raw(c, raw), 422)
    assert body["type"] == "urn:foxhunt:problem:validation" and body["errors"]
    assert _stored(c) == 0


def test_the_largest_accepted_values_are_stored_as_sent(c: Controller) -> None:
    """The bounds are what the store holds: the largest value each accepts round-trips."""
    body = {
        "pool": "cpu",
        "deadline": "9999-12-31T22:59:59-01:00",
        "config": {"run": {"steps": INT32_MAX, "seed": INT32_MAX}, "model": {"v_min": -1e6, "v_max": 1e6}},
    }
    created = c.request("POST", "/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    job = c.request("GET", f"/v1/jobs/{created.json()['id']}").json()
    assert job["config"]["run"]["steps"] == INT32_MAX and job["epochs"] == -(-INT32_MAX // 2000)
    assert job["deadline"].startswith("9999-12-31T23:59:59")


def _cursor(content: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(content).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"submitter": "\x00"}, 422),
        ({"pool": "\x00"}, 422),
        ({"pool": "cpu\x00"}, 422),
        ({"label_selector": "a=\x00"}, 422),
        ({"label_selector": "\x00=b"}, 422),
        ({"cursor": _cursor(["2030-01-01T00:00:00", "job-\x00"])}, 400),
        ({"cursor": _cursor(["0001-01-01T00:00:00+01:00", "job-a"])}, 400),
        ({"cursor": _cursor(["2030-01-01T00:00:00", 5])}, 400),
        ({"cursor": _cursor({"a": 1})}, 400),
        ({"cursor": "\x00"}, 400),
    ],
)
def test_bad_query_parameters_are_4xx(c: Controller, params: dict[str, str], status: int) -> None:
    _assert_problem(c.request("GET", "/v1/jobs", params=params), status)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/job-%00"),
        ("DELETE", "/v1/jobs/job-%00"),
        ("POST", "/v1/jobs/job-%00/retry"),
        ("GET", "/v1/jobs/job-%00/logs"),
        ("GET", "/v1/jobs/" + "a" * 300),
    ],
)
def test_a_job_id_no_job_can_have_is_404(c: Controller, method: str, path: str) -> None:
    body = _assert_problem(c.request(method, path), 404)
    assert body["type"] == "urn:foxhunt:problem:job-not-found"


class _BrokenPing(LocalBackend):
    """A backend with a bug: its ping raises something no handler expects."""

    def ping(self) -> None:
        raise RuntimeError("secret internals")


def test_an_unexpected_exception_is_a_problem_json_500_that_tells_nothing(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, run_reconciler=False)
    app = create_app(settings, backend=_BrokenPing.from_settings(settings))
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/readyz")
    body = _assert_problem(response, 500)
    assert body["type"] == "urn:foxhunt:problem:internal" and "secret" not in response.text


# ---- property-based: bodies and query strings built from the values above ----------------------------

EVIL_INTS = st.sampled_from([0, -1, 1, INT32_MAX, INT32_MAX + 1, 2**32, 2**63, 2**64, 10**25, -(2**63) - 1])
EVIL_FLOATS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "-0.0", "0.5"])
EVIL_STRINGS = st.one_of(
    st.sampled_from(["", "\x00", "cpu\x00", "h200", "cpu", "Team A", "a" * 300, "é", "\ud7ff", "job-\x00"]),
    st.text(max_size=12),
)
EVIL_DATES = st.sampled_from(
    [
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2030-01-01T00:00:00",
        "2030-02-30T00:00:00Z",
        "2030-01-01T00:00:00+23:59",
    ]
)
INT_FIELDS = [
    ("run", "steps"),
    ("run", "seed"),
    ("run", "batch_size"),
    ("run", "log_every"),
    ("run", "eval_every"),
    ("run", "metrics_port"),
    ("data", "learning_starts"),
    ("data", "market_horizon"),
    ("data", "epsilon_decay_steps"),
    ("loss", "vaccine_every"),
    ("replay", "capacity"),
    ("model", "atoms"),
]
FLOAT_FIELDS = [("model", "v_min"), ("model", "v_max"), ("optim", "lr"), ("loss", "reward_scale"), ("optim", "eps")]
STRING_FIELDS = [("data", "env_id"), ("data", "dataset"), ("run", "pushgateway_url")]


def _literal(value: object) -> str:
    """JSON text of a value; the float names above are written bare, as a non-standard client would."""
    if isinstance(value, str) and value.lstrip("-").replace(".", "", 1).replace("e", "", 1).isdigit():
        return value
    if value in ("NaN", "Infinity", "-Infinity"):
        return str(value)
    return json.dumps(value)


@st.composite
def bodies(draw: st.DrawFn) -> str:
    """A JSON body: some top-level fields and some config fields, each either sane or hostile."""
    fields: dict[str, str] = {}
    if draw(st.booleans()):
        fields["pool"] = _literal(draw(st.one_of(EVIL_STRINGS, st.just("cpu"))))
    for name in draw(st.sets(st.sampled_from(["model", "name", "commit_sha"]), max_size=2)):
        fields[name] = _literal(draw(EVIL_STRINGS))
    for name in draw(st.sets(st.sampled_from(["epochs", "priority", "hyperopt_trials"]), max_size=2)):
        fields[name] = _literal(draw(EVIL_INTS))
    if draw(st.booleans()):
        fields["deadline"] = _literal(draw(EVIL_DATES))
    if draw(st.booleans()):
        key, value = draw(EVIL_STRINGS), draw(EVIL_STRINGS)
        fields["labels"] = "{" + f"{_literal(key)}: {_literal(value)}" + "}"
    sections: dict[str, dict[str, str]] = {}
    for section, name in draw(st.sets(st.sampled_from(INT_FIELDS), max_size=3)):
        sections.setdefault(section, {})[name] = _literal(draw(EVIL_INTS))
    for section, name in draw(st.sets(st.sampled_from(FLOAT_FIELDS), max_size=2)):
        sections.setdefault(section, {})[name] = draw(EVIL_FLOATS)
    for section, name in draw(st.sets(st.sampled_from(STRING_FIELDS), max_size=2)):
        sections.setdefault(section, {})[name] = _literal(draw(EVIL_STRINGS))
    sections.setdefault("run", {}).setdefault("steps", "2")
    config = ", ".join(
        f'"{section}": {{' + ", ".join(f'"{k}": {v}' for k, v in values.items()) + "}"
        for section, values in sections.items()
    )
    fields["config"] = "{" + config + "}"
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


QUERIES = st.dictionaries(
    st.sampled_from(["state", "pool", "label_selector", "submitter", "limit", "cursor"]),
    st.one_of(
        EVIL_STRINGS,
        EVIL_INTS.map(str),
        st.sampled_from(["a=b", "a=\x00", "=", "RUNNING", _cursor(["2030-01-01T00:00:00", "job-\x00"])]),
    ),
    max_size=4,
)


@pytest.fixture
def fuzzed(tmp_path: Path, database_url: str) -> Iterator[TestClient]:
    """One app per store for the whole property run; a 5xx comes back as a response, not an exception."""
    settings = make_settings(tmp_path, database_url=database_url, run_reconciler=False, auth_disabled=True)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


@hypothesis_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=bodies(), query=QUERIES)
def test_no_body_or_query_string_makes_a_5xx_and_a_4xx_stores_nothing(
    fuzzed: TestClient, raw: str, query: dict[str, str]
) -> None:
    store = fuzzed.app.state.services.store  # type: ignore[attr-defined]
    before = len(store.list_jobs(limit=500)[0])
    submitted = fuzzed.post("/v1/jobs", content=raw.encode(), headers={"content-type": "application/json"})
    assert submitted.status_code < 500, (raw, submitted.text)
    after = len(store.list_jobs(limit=500)[0])
    if submitted.status_code >= 400:
        assert submitted.headers["content-type"] == PROBLEM
        assert after == before, raw
    else:
        assert after == before + 1 and submitted.status_code == 201
    listed = fuzzed.get("/v1/jobs", params=query)
    assert listed.status_code < 500, (query, listed.text)
    if listed.status_code >= 400:
        assert listed.headers["content-type"] == PROBLEM
