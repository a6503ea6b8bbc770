"""Request bodies: capped in size and time, and never read before the caller is authenticated.

The ordering tests call the ASGI app directly with a body that records what was pulled from it, so
they assert what the controller read (nothing, or at most one chunk past the limit), not its memory.
The stalled-body tests run a real uvicorn server and talk to it over a raw socket.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from service.api.routes import health, jobs, pools
from service.app import create_app
from service.auth import create_token
from service.domain import JobState
from service.progress import progress_token
from tests.service.factories import live_server, make_settings

LIMIT = 64 * 1024
CHUNK = 16 * 1024
SECRET = "s" * 32


class Body:
    """An ASGI request body handed out chunk by chunk; counts what the app pulled."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0

    async def receive(self) -> dict[str, Any]:
        chunk = next(self.chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        self.pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}


def _endless(chunk: bytes = b" " * CHUNK, total: int = 50 * 1024 * 1024) -> Iterator[bytes]:
    """50 MB of JSON whitespace, never materialised at once."""
    for _ in range(total // len(chunk)):
        yield chunk


def _call(app: FastAPI, method: str, path: str, headers: dict[str, str], body: Body) -> tuple[int, dict[str, str], Any]:
    """One request through the whole ASGI app (middleware included), as a server would make it."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in {"host": "test", **headers}.items()],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, body.receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    response_headers = {k.decode(): v.decode() for k, v in start["headers"]}
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], response_headers, json.loads(content)


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return create_app(make_settings(tmp_path, run_reconciler=False, max_body_bytes=LIMIT, progress_secret=SECRET))


@pytest.fixture
def bearer(app: FastAPI) -> dict[str, str]:
    secret, _ = create_token(app.state.services.store, name="alice", tenant="team-a")
    return {"authorization": f"Bearer {secret}", "content-type": "application/json"}


def _no_jobs(app: FastAPI) -> bool:
    return not any(app.state.services.store.counts_by_state().values())


def test_a_declared_length_over_the_limit_is_413_before_a_byte_is_read(app: FastAPI, bearer: dict[str, str]) -> None:
    body = Body(_endless())
    status, headers, problem = _call(app, "POST", "/v1/jobs", {**bearer, "content-length": str(50 << 20)}, body)
    assert status == 413 and problem["type"] == "urn:foxhunt:problem:body-too-large"
    assert f"limited to {LIMIT} bytes" in problem["detail"] and str(50 << 20) in problem["detail"]
    assert headers["content-type"] == "application/problem+json" and headers["connection"] == "close"
    assert body.pulled == 0 and _no_jobs(app)


def test_a_chunked_body_is_413_at_the_first_chunk_past_the_limit(app: FastAPI, bearer: dict[str, str]) -> None:
    body = Body(_endless())
    status, headers, problem = _call(app, "POST", "/v1/jobs", {**bearer, "transfer-encoding": "chunked"}, body)
    assert status == 413 and problem["type"] == "urn:foxhunt:problem:body-too-large"
    assert headers["connection"] == "close"
    assert LIMIT < body.pulled <= LIMIT + CHUNK and _no_jobs(app)


def test_a_body_within_the_limit_is_read_and_the_job_stored(app: FastAPI, bearer: dict[str, str]) -> None:
    payload = json.dumps({"config": {"run": {"steps": 2}}, "pool": "cpu"}).encode()
    body = Body(iter([payload]))
    status, headers, job = _call(app, "POST", "/v1/jobs", {**bearer, "content-length": str(len(payload))}, body)
    assert status == 201 and job["state"] == "QUEUED" and "connection" not in headers


@pytest.mark.parametrize("authorization", [None, "Bearer not-a-token"], ids=["no-token", "unknown-token"])
def test_an_unauthenticated_submission_is_401_with_its_body_unread(app: FastAPI, authorization: str | None) -> None:
    payload = json.dumps({"config": {"run": {"steps": 2}}, "pool": "cpu"}).encode()
    headers = {"content-type": "application/json", "content-length": str(len(payload))}
    if authorization:
        headers["authorization"] = authorization
    body = Body(iter([payload]))
    status, response_headers, problem = _call(app, "POST", "/v1/jobs", headers, body)
    assert status == 401 and problem["type"] == "urn:foxhunt:problem:unauthorized"
    assert body.pulled == 0 and response_headers["connection"] == "close" and _no_jobs(app)


def test_a_progress_report_with_a_wrong_token_is_refused_with_its_body_unread(app: FastAPI) -> None:
    payload = json.dumps({"step": 1}).encode()
    for token, expected in ((None, 401), (progress_token(SECRET, "job-other"), 403)):
        headers = {"content-type": "application/json", "content-length": str(len(payload))}
        if token:
            headers["authorization"] = f"Bearer {token}"
        body = Body(iter([payload]))
        status, _, _ = _call(app, "PUT", "/v1/jobs/job-1/progress", headers, body)
        assert (status, body.pulled) == (expected, 0)


def test_no_route_has_fastapi_read_its_body_before_its_dependencies() -> None:
    """FastAPI reads a declared body parameter before solving any dependency, authentication included:
    every body must be read by a dependency declared after the route's authentication instead."""
    routes = [r for module in (health, jobs, pools) for r in module.router.routes if isinstance(r, APIRoute)]
    assert any({"POST", "PUT"} & (r.methods or set()) for r in routes)
    assert [r.path for r in routes if r.body_field is not None] == []


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def _exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send a request head and part of a body, then read until the server closes the connection.

    The socket timeout fails the test if the server holds the connection instead."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def _head(length: int, token: str) -> bytes:
    return (
        "POST /v1/jobs HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_content_length_with_no_body_behind_it_is_answered_at_once_and_closed(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, run_reconciler=False))
    token, _ = create_token(app.state.services.store, name="alice", tenant="team-a")
    with live_server(app) as url:
        response = _exchange(_port(url), _head(50 << 20, token))
    assert response.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in response.lower() and b"body-too-large" in response


def test_a_stalled_body_is_408_and_its_connection_closed(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path, run_reconciler=False, body_timeout_seconds=0.5))
    token, _ = create_token(app.state.services.store, name="alice", tenant="team-a")
    with live_server(app) as url:
        response = _exchange(_port(url), _head(200, token), b'{"config": {')
    assert response.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in response.lower() and b"within 0.5 s (12 bytes came)" in response
    assert app.state.services.store.counts_by_state()[JobState.QUEUED] == 0
