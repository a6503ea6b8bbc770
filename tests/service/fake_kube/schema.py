"""The Argo Workflow CRD's openAPIV3Schema turned into a JSON Schema the fake API server enforces.

A real API server checks a custom resource against its structural schema: OpenAPI v3 keywords
(`nullable`), Kubernetes extensions (`x-kubernetes-int-or-string`, `x-kubernetes-preserve-unknown-fields`)
and, with `fieldValidation=Strict` (kubectl's default), it rejects unknown fields instead of pruning
them. We convert those rules to Draft 4 (the dialect OpenAPI 3.0 schemas are written in) and reject
unknown fields, so a Workflow carrying e.g. `spec.resources` fails here as it would on a strict
server. CEL rules (`x-kubernetes-validations`) are not evaluated: none touch the fields we send.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests import upstream

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _convert(node: Any) -> Any:
    """Rewrite one OpenAPI v3 structural-schema node (recursively) as Draft 4 JSON Schema."""
    if isinstance(node, list):
        return [_convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: _convert(value)
        for key, value in node.items()
        if not key.startswith("x-kubernetes-") and key not in ("nullable", "description", "format")
    }
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


@functools.cache
def workflow_validator(crd_path: Path | None = None) -> jsonschema.Draft4Validator:
    """A validator for Workflow objects, built once per process (the CRD is ~3 MB of YAML).

    By default the Workflow CRD of the Argo module in cluster/versions.env (tests/upstream.py).
    """
    with (crd_path or upstream.argo_workflow_crd()).open() as f:
        crd = yaml.load(f, Loader=yaml.CSafeLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = _convert(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft4Validator(schema)


def metadata_errors(metadata: dict[str, Any]) -> list[str]:
    """What the API server's ObjectMeta validation would refuse: bad names, labels and annotations."""
    errors: list[str] = []
    name = metadata.get("name", "")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errors.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain is required")
    for key, value in (metadata.get("labels") or {}).items():
        key_name = key.rsplit("/", 1)[-1]
        if len(key_name) > 63 or not _LABEL_NAME.match(key_name):
            errors.append(f"metadata.labels: Invalid value: {key!r}: not a valid label key")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(f"metadata.labels: Invalid value: {value!r}: not a valid label value")
    for key, value in (metadata.get("annotations") or {}).items():
        if not isinstance(value, str):
            errors.append(f"metadata.annotations.{key}: Invalid value: annotations must be strings")
    return errors


def workflow_errors(obj: dict[str, Any]) -> list[str]:
    """Every reason the CRD schema (and ObjectMeta rules) give to reject this Workflow; empty if valid."""
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in workflow_validator().iter_errors(obj)
    ]
    return errors + metadata_errors(obj.get("metadata") or {})
