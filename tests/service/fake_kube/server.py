"""An HTTP-level fake of the Kubernetes API server, for the calls the Argo backend makes.

Speaks the REST protocol the official `kubernetes` client speaks, so the client runs unchanged:
Workflows (create, get, list, watch, merge patch, delete), pods (list, get), pods/log (with
follow) and coordination.k8s.io Leases (create, get, replace with resourceVersion conflicts). Faults
are injected per request (5xx, dropped connections, a commit whose answer is lost) and tests drive
workflows through their phases with the helper methods of `FakeKube`.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.service.fake_kube.schema import workflow_errors
from tests.service.fake_kube.state import ApiError, Obj, State, matches, merge_patch, now_rfc3339, parse_selector

GROUP_PREFIX = "/apis/argoproj.io/v1alpha1/namespaces/"
CORE_PREFIX = "/api/v1/namespaces/"
LEASE_PREFIX = "/apis/coordination.k8s.io/v1/namespaces/"
KINDS = {"workflows": ("argoproj.io/v1alpha1", "Workflow"), "pods": ("v1", "Pod")}
TERMINAL_PHASES = ("Succeeded", "Failed", "Error")


class FakeKube:
    """A running fake API server plus the knobs tests turn (phases, pods, logs, faults)."""

    def __init__(self, *, namespace: str = "foxhunt", history: int = 200, bookmark_interval: float = 60.0):
        self.namespace = namespace
        self.state = State(history=history)
        self.bookmark_interval = bookmark_interval
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.faults: list[tuple[str, int]] = []  # ("status"|"drop"|"commit-then-drop", code)
        self.bookmark_seq = 0
        self.watch_generation = 0
        self.watches_paused = False
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig at `path` whose one context points at this server (token auth, as a controller's)."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "controller", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "controller"}}],
                    "current-context": "fake",
                }
            )
        )
        return path

    def __enter__(self) -> FakeKube:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.state.cond:
            self.state.closing = True
            self.state.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # ---- faults -------------------------------------------------------------------------------
    def fail_next(self, n: int, code: int = 500) -> None:
        """Answer the next `n` requests with HTTP `code` and a Status body, doing nothing."""
        with self._lock:
            self.faults += [("status", code)] * n

    def drop_next(self, n: int) -> None:
        """Close the connection on the next `n` requests without answering."""
        with self._lock:
            self.faults += [("drop", 0)] * n

    def commit_then_drop(self, n: int = 1) -> None:
        """Carry out the next `n` requests, then drop the connection: the client never sees the answer."""
        with self._lock:
            self.faults += [("commit-then-drop", 0)] * n

    def take_fault(self) -> tuple[str, int] | None:
        with self._lock:
            return self.faults.pop(0) if self.faults else None

    # ---- watches ------------------------------------------------------------------------------
    def request_bookmark(self) -> None:
        """Every open watch that allows bookmarks sends one now."""
        with self.state.cond:
            self.bookmark_seq += 1
            self.state.cond.notify_all()

    def end_watches(self) -> None:
        """Close every open watch stream, as an API server restart or a load balancer would."""
        with self.state.cond:
            self.watch_generation += 1
            self.state.cond.notify_all()

    def pause_watches(self, paused: bool = True) -> None:
        """While paused, open watch streams deliver nothing (a slow stream); resuming catches up."""
        with self.state.cond:
            self.watches_paused = paused
            self.state.cond.notify_all()

    def compact(self) -> None:
        """Forget the event history: resuming a watch from any older resourceVersion now gives 410 Gone."""
        self.state.compact()

    def watch_requests(self) -> list[dict[str, str]]:
        """Query parameters of every Workflow watch request, in order."""
        return [q for m, p, q in self.requests if m == "GET" and p.endswith("/workflows") and "watch" in q]

    # ---- leases -------------------------------------------------------------------------------
    def lease(self, name: str) -> Obj | None:
        """The Lease `name` as stored, or None."""
        try:
            return self.state.get("leases", self.namespace, name)
        except ApiError:
            return None

    # ---- workflows ----------------------------------------------------------------------------
    def workflow(self, name: str) -> Obj:
        return self.state.get("workflows", self.namespace, name)

    def workflows(self) -> list[Obj]:
        return self.state.list("workflows", self.namespace, None)[0]

    def update_workflow(self, name: str, change: Callable[[Obj], None]) -> Obj:
        """Apply `change` to a copy of the workflow and store it (one MODIFIED event)."""
        obj = self.workflow(name)
        change(obj)
        return self.state.replace("workflows", self.namespace, name, obj)

    def set_phase(
        self, name: str, phase: str, message: str | None = None, *, failed_step: tuple[str, str] | None = None
    ) -> Obj:
        """Move a workflow to `phase` as Argo's controller would, stamping startedAt/finishedAt.

        `failed_step` (template, the pod's message) ends it as a real Argo ends a workflow whose step
        failed (seen on the test cluster, tests/cluster): the step's pod node carries the template's
        name and the reason, the workflow's message names only the node."""

        def change(obj: Obj) -> None:
            status = obj.setdefault("status", {})
            status["phase"] = phase
            status.setdefault("startedAt", now_rfc3339())
            if phase in TERMINAL_PHASES:
                status["finishedAt"] = now_rfc3339()
            if message is not None:
                status["message"] = message
            if failed_step is not None:
                template, reason = failed_step
                node_id = f"{name}-{abs(hash(template)) % 10**10}"
                status["nodes"] = {
                    node_id: {
                        "id": node_id, "name": f"{name}[1].{template}", "displayName": template, "type": "Pod",
                        "templateName": template, "phase": phase, "message": reason,
                        "finishedAt": now_rfc3339(),
                    }
                }  # fmt: skip
                status["message"] = f"child '{node_id}' failed"

        return self.update_workflow(name, change)

    def wait_for_image(self, name: str, template: str, message: str, started: str) -> Obj:
        """A step's pod node Pending on its image, as a real Argo shows one whose image cannot be pulled
        (seen on the test cluster's real node, tests/cluster): the kubelet's reason, then its message."""

        def change(obj: Obj) -> None:
            status = obj.setdefault("status", {})
            status["phase"] = "Running"
            status.setdefault("startedAt", started)
            node_id = f"{name}-{abs(hash(template)) % 10**10}"
            status.setdefault("nodes", {})[node_id] = {
                "id": node_id, "name": f"{name}[0].{template}", "displayName": template, "type": "Pod",
                "templateName": template, "phase": "Pending", "message": message, "startedAt": started,
            }  # fmt: skip

        return self.update_workflow(name, change)

    def delete_workflow(self, name: str) -> None:
        """Delete as Argo's TTL / GC would."""
        self.state.delete("workflows", self.namespace, name)

    # ---- pods and logs ------------------------------------------------------------------------
    def add_pod(self, workflow: str, pod: str, lines: tuple[str, ...] = (), *, done: bool = False) -> None:
        """A workflow step's pod, as Argo creates it, with its `main` container's log so far."""
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "labels": {"workflows.argoproj.io/workflow": workflow}},
            "spec": {"containers": [{"name": "wait", "image": "argoexec"}, {"name": "main", "image": "t"}]},
        }
        with self.state.cond:
            self.state.logs[(self.namespace, pod)] = list(lines)
            if done:
                self.state.logs_done.add((self.namespace, pod))
        self.state.create("pods", self.namespace, obj)

    def append_log(self, pod: str, *lines: str) -> None:
        with self.state.cond:
            self.state.logs[(self.namespace, pod)].extend(lines)
            self.state.cond.notify_all()

    def set_pod_phase(self, pod: str, phase: str) -> None:
        """The pod's phase, with its log stream left as it is: a kubelet that never ends a followed log
        (kwok's, on the test cluster) shows a finished pod this way."""
        obj = self.state.get("pods", self.namespace, pod)
        obj = {**obj, "status": {**(obj.get("status") or {}), "phase": phase}}
        self.state.replace("pods", self.namespace, pod, obj)

    def finish_pod(self, pod: str) -> None:
        """The container exited: a follow stream of its log ends after the last line."""
        with self.state.cond:
            self.state.logs_done.add((self.namespace, pod))
            self.state.cond.notify_all()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a closed watch, a test that ended) is normal; anything else is shown."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _make_handler(fake: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.fake = fake
    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeKube

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: test output stays readable."""

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    # ---- plumbing -----------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.fake.requests.append((method, url.path, query))
        fault = self.fake.take_fault()
        if fault and fault[0] == "drop":
            self.close_connection = True
            return
        if fault and fault[0] == "status":
            self._send_json(fault[1], ApiError(fault[1], "InternalError", "injected fault").status())
            return
        try:
            code, payload = self._route(method, url.path, query, body)
        except ApiError as error:
            code, payload = error.code, error.status()
        if fault and fault[0] == "commit-then-drop":
            self.close_connection = True
            return
        if payload is not None:
            self._send_json(code, payload)

    def _send_json(self, code: int, payload: Obj) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> tuple[int, Obj | None]:
        if path.startswith(LEASE_PREFIX):
            return self._lease(method, path[len(LEASE_PREFIX) :].split("/"), body)
        if path.startswith(GROUP_PREFIX):
            parts = path[len(GROUP_PREFIX) :].split("/")
        elif path.startswith(CORE_PREFIX):
            parts = path[len(CORE_PREFIX) :].split("/")
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace, resource, rest = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
        if (resource == "workflows") != path.startswith(GROUP_PREFIX) or resource not in KINDS:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        state = self.fake.state
        if not rest and method == "GET":
            if query.get("watch") in ("true", "1"):
                self._watch(resource, namespace, query)
                return 200, None
            return 200, self._list(resource, namespace, query)
        if not rest and method == "POST" and resource == "workflows":
            return 201, state.create(resource, namespace, self._valid_workflow(_json_body(body)))
        if len(rest) == 1 and method == "GET":
            return 200, state.get(resource, namespace, rest[0])
        if len(rest) == 1 and method == "PATCH" and resource == "workflows":
            return 200, self._patch(namespace, rest[0], body)
        if len(rest) == 1 and method == "DELETE" and resource == "workflows":
            state.delete(resource, namespace, rest[0])
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        if rest[1:] == ["log"] and method == "GET" and resource == "pods":
            self._log(namespace, rest[0], query)
            return 200, None
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    # ---- resources ----------------------------------------------------------------------------
    def _lease(self, method: str, parts: list[str], body: bytes) -> tuple[int, Obj]:
        """Leases as the API server keeps them: a replace must carry the current resourceVersion."""
        state = self.fake.state
        if len(parts) < 2 or parts[1] != "leases" or len(parts) > 3:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({parts})")
        namespace, name = parts[0], parts[2] if len(parts) == 3 else None
        if name is None and method == "POST":
            return 201, state.create("leases", namespace, _json_body(body))
        if name is not None and method == "GET":
            return 200, state.get("leases", namespace, name)
        if name is not None and method == "PUT":
            obj = _json_body(body)
            with state.cond:  # compare-and-swap on a resourceVersion sent, as the API server does
                current = state.get("leases", namespace, name)
                sent = obj.get("metadata", {}).get("resourceVersion")
                if sent is not None and sent != current["metadata"]["resourceVersion"]:
                    message = f'Operation cannot be fulfilled on leases "{name}": the object has been modified'
                    raise ApiError(409, "Conflict", message)
                return 200, state.replace("leases", namespace, name, obj)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on leases")

    def _valid_workflow(self, obj: Obj) -> Obj:
        if obj.get("apiVersion") != "argoproj.io/v1alpha1" or obj.get("kind") != "Workflow":
            raise ApiError(400, "BadRequest", "the API version/kind in the body do not match workflows")
        errors = workflow_errors(obj)
        if errors:
            name = obj.get("metadata", {}).get("name", "")
            raise ApiError(422, "Invalid", f'Workflow.argoproj.io "{name}" is invalid: ' + "; ".join(errors))
        return obj

    def _patch(self, namespace: str, name: str, body: bytes) -> Obj:
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type != "application/merge-patch+json":
            # A real server refuses strategic merge patch on custom resources; JSON patch is not faked.
            message = f"the body of the request was in an unknown format: {content_type}"
            raise ApiError(415, "UnsupportedMediaType", message)
        state = self.fake.state
        with state.cond:  # read-modify-write atomically, as the API server's optimistic update does
            current = state.get("workflows", namespace, name)
            patched = merge_patch(current, _json_body(body))
            patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self._valid_workflow(patched)
            return state.replace("workflows", namespace, name, patched)

    def _list(self, resource: str, namespace: str, query: dict[str, str]) -> Obj:
        items, rv = self.fake.state.list(resource, namespace, query.get("labelSelector"))
        start = query.get("continue", "")
        items = [i for i in items if i["metadata"]["name"] > start] if start else items
        limit = int(query.get("limit") or 0)
        metadata: Obj = {"resourceVersion": rv}
        if limit and len(items) > limit:
            items = items[:limit]
            metadata["continue"] = items[-1]["metadata"]["name"]
        api_version, kind = KINDS[resource]
        return {"apiVersion": api_version, "kind": kind + "List", "metadata": metadata, "items": items}

    def _watch(self, resource: str, namespace: str, query: dict[str, str]) -> None:
        """Stream events as JSON lines until timeoutSeconds, `end_watches()` or shutdown."""
        fake, state = self.fake, self.fake.state
        terms = parse_selector(query.get("labelSelector"))
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        api_version, kind = KINDS[resource]
        self._start_stream("application/json")
        with state.cond:
            generation, bookmark_seq = fake.watch_generation, fake.bookmark_seq
            requested = query.get("resourceVersion") or ""
            if requested in ("", "0"):
                cursor = state.rv
                pending = [("ADDED", o) for o in state.list(resource, namespace, None)[0] if matches(o, terms)]
            else:
                cursor, pending = int(requested), []
        last_bookmark = time.monotonic()
        try:
            while True:
                for type_, obj in pending:
                    self._chunk(json.dumps({"type": type_, "object": obj}).encode() + b"\n")
                pending = []
                with state.cond:
                    if fake.watches_paused and not state.closing:
                        state.cond.wait(timeout=0.05)
                        continue
                    if state.rv == cursor:
                        state.cond.wait(timeout=0.05)
                        if fake.watches_paused and not state.closing:
                            continue  # paused while we waited: what changed since stays undelivered
                    if cursor < state.compacted_rv:
                        gone = ApiError(410, "Expired", f"too old resource version: {cursor} ({state.rv})")
                        self._chunk(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
                        break
                    events = [e for e in state.events if e.rv > cursor]
                    for event in events:
                        cursor = event.rv
                        if event.resource == resource and event.namespace == namespace and matches(event.obj, terms):
                            pending.append((event.type, copy.deepcopy(event.obj)))
                    if not events:
                        cursor = state.rv  # nothing for us up to here: a bookmark may say so
                    send_bookmark = (
                        bookmarks
                        and not pending
                        and (
                            fake.bookmark_seq != bookmark_seq
                            or time.monotonic() - last_bookmark > fake.bookmark_interval
                        )
                    )
                    bookmark_seq = fake.bookmark_seq
                    ended = state.closing or fake.watch_generation != generation or time.monotonic() > deadline
                if send_bookmark:
                    last_bookmark = time.monotonic()
                    mark = {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": str(cursor)}}
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                if ended and not pending:
                    break
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _log(self, namespace: str, pod: str, query: dict[str, str]) -> None:
        state = self.fake.state
        obj = state.get("pods", namespace, pod)
        container = query.get("container") or ""
        if container not in [c["name"] for c in obj["spec"]["containers"]]:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {pod}")
        follow = query.get("follow") in ("true", "1")
        self._start_stream("text/plain")
        sent = 0
        try:
            while True:
                with state.cond:
                    lines = state.logs.get((namespace, pod), [])[sent:]
                    done = (namespace, pod) in state.logs_done or state.closing or not follow
                    if not lines and not done:
                        state.cond.wait(timeout=0.05)
                        continue
                sent += len(lines)
                if lines:
                    self._chunk("".join(line + "\n" for line in lines).encode())
                if done and not lines:
                    break
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _json_body(body: bytes) -> Obj:
    try:
        parsed = json.loads(body or b"null")
    except json.JSONDecodeError as error:
        raise ApiError(400, "BadRequest", f"invalid JSON body: {error}") from error
    if not isinstance(parsed, dict):
        raise ApiError(400, "BadRequest", "the request body must be a JSON object")
    return parsed
