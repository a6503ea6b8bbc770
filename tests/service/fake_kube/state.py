"""The fake API server's object store: resourceVersions, label selectors, a bounded event history.

Behaves as etcd + the API server's watch cache do for the calls the controller makes: every write
bumps one global resourceVersion, each change is kept (up to `history` events) so a watch can resume
from a resourceVersion, and resuming from one older than the kept history is answered with 410 Gone.
"""

from __future__ import annotations

import collections
import copy
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource, namespace, name)


class ApiError(Exception):
    """An API Status the server answers with (404, 409, 410, 422, ...)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> Obj:
        """The `Status` object a real API server sends for this error."""
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    namespace: str
    obj: Obj


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_selector(selector: str | None) -> list[tuple[str, str, str | None]]:
    """`a=b,c!=d,e,!f` -> [(op, key, value)]: the equality-based label selector syntax."""
    terms: list[tuple[str, str, str | None]] = []
    for raw in (selector or "").split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "==" in term or "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        elif term.startswith("!"):
            terms.append(("!exists", term[1:].strip(), None))
        else:
            terms.append(("exists", term, None))
    return terms


def matches(obj: Obj, terms: list[tuple[str, str, str | None]]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for op, key, value in terms:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!exists" and key in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclass
class State:
    """Objects by (resource, namespace, name), guarded by one condition that wakes watchers."""

    history: int = 200
    objects: dict[Key, Obj] = field(default_factory=dict)
    logs: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (namespace, pod) -> lines
    logs_done: set[tuple[str, str]] = field(default_factory=set)
    events: collections.deque[Event] = field(default_factory=collections.deque)
    rv: int = 1000
    compacted_rv: int = 1000  # events with rv <= this are gone from the history
    closing: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def _record(self, type_: str, resource: str, namespace: str, obj: Obj) -> None:
        self.events.append(Event(self.rv, type_, resource, namespace, copy.deepcopy(obj)))
        while len(self.events) > self.history:
            self.compacted_rv = self.events.popleft().rv
        self.cond.notify_all()

    def _bump(self, obj: Obj) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        with self.cond:
            meta = obj.setdefault("metadata", {})
            key = (resource, namespace, meta.get("name", ""))
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{key[2]}" already exists')
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            meta["generation"] = 1
            self._bump(obj)
            self.objects[key] = obj
            self._record("ADDED", resource, namespace, obj)
            return copy.deepcopy(obj)

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            return copy.deepcopy(obj)

    def replace(self, resource: str, namespace: str, name: str, obj: Obj) -> Obj:
        """Store a changed object (patch or test helper), bumping its resourceVersion: one MODIFIED event."""
        with self.cond:
            old = self.objects.get((resource, namespace, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            obj["metadata"] = {**obj.get("metadata", {}), **{k: old["metadata"][k] for k in ("uid", "name")}}
            if obj.get("spec") != old.get("spec"):
                obj["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            self._bump(obj)
            self.objects[(resource, namespace, name)] = obj
            self._record("MODIFIED", resource, namespace, obj)
            return copy.deepcopy(obj)

    def delete(self, resource: str, namespace: str, name: str) -> Obj:
        with self.cond:
            obj = self.objects.pop((resource, namespace, name), None)
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            self._bump(obj)
            self._record("DELETED", resource, namespace, obj)
            return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str, selector: str | None) -> tuple[list[Obj], str]:
        """Matching objects sorted by name, and the list's resourceVersion (the store's current one)."""
        terms = parse_selector(selector)
        with self.cond:
            items = [
                copy.deepcopy(obj)
                for (res, ns, _), obj in sorted(self.objects.items())
                if res == resource and ns == namespace and matches(obj, terms)
            ]
            return items, str(self.rv)

    def compact(self) -> None:
        """Drop the whole event history, as etcd compaction does: older resourceVersions now give 410."""
        with self.cond:
            self.events.clear()
            self.compacted_rv = self.rv
