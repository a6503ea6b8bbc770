"""k8s/components/monitoring: renders, validates against upstream schemas, and its rules pass promtool."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests import upstream
from tests.k8s.conftest import COMPONENT, DASHBOARDS, dashboards, prometheus_rule_groups

RULES_TEST = Path(__file__).with_name("rules_test.yaml")
ALERTS = ("FoxhuntTrainingStalled", "FoxhuntStepTimeRegression", "FoxhuntGuardTrips", "FoxhuntScrapeTargetDown")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The component rendered by Kustomize through a minimal Kustomization that includes it."""
    root = tmp_path_factory.mktemp("kustomize")
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "foxhunt-test",
                "components": [os.path.relpath(COMPONENT, root)],  # Kustomize refuses absolute paths
            }
        )
    )
    out = subprocess.run(["kubectl", "kustomize", str(root)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _crd_schema(name: str) -> dict[str, Any]:
    crd = yaml.safe_load(upstream.prometheus_operator_crd(name).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def test_component_renders_monitors_rules_and_dashboards(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == ["ConfigMap", "PodMonitor", "PrometheusRule", "ServiceMonitor"]
    assert all(d["metadata"]["namespace"] == "foxhunt-test" for d in rendered)


@pytest.mark.parametrize(
    ("kind", "crd"),
    [
        ("PodMonitor", "monitoring.coreos.com_podmonitors.yaml"),
        ("ServiceMonitor", "monitoring.coreos.com_servicemonitors.yaml"),
        ("PrometheusRule", "monitoring.coreos.com_prometheusrules.yaml"),
    ],
)
def test_operator_objects_validate_against_their_crds(rendered: list[dict[str, Any]], kind: str, crd: str) -> None:
    validator = jsonschema.Draft7Validator(_crd_schema(crd))
    doc = _one(rendered, kind)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, errors[:5]
    broken = {**doc, "spec": {**doc["spec"], "unexpectedField": 1}}
    if kind == "PrometheusRule":
        broken = {**doc, "spec": {"groups": [{"rules": []}]}}  # a group needs a name
    else:
        broken = {**doc, "spec": {**doc["spec"], "selector": {"matchLabels": "not-a-map"}}}
    assert list(validator.iter_errors(broken)), f"{kind}: the schema check cannot fail"


def test_monitors_select_what_the_workloads_expose(rendered: list[dict[str, Any]]) -> None:
    """Trainer pods carry app.kubernetes.io/name=foxhunt-trainer and port `metrics`; the Service port `http`."""
    pod_monitor = _one(rendered, "PodMonitor")["spec"]
    assert pod_monitor["selector"]["matchLabels"] == {"app.kubernetes.io/name": "foxhunt-trainer"}
    assert [e["port"] for e in pod_monitor["podMetricsEndpoints"]] == ["metrics"]
    service_monitor = _one(rendered, "ServiceMonitor")["spec"]
    assert service_monitor["selector"]["matchLabels"] == {"app.kubernetes.io/name": "foxhunt-controller"}
    assert [e["port"] for e in service_monitor["endpoints"]] == ["http"]
    root = COMPONENT.parents[2]
    template = (root / "argo" / "compile-and-train.yaml").read_text()
    assert "app.kubernetes.io/name: foxhunt-trainer" in template
    assert re.search(r"- name: metrics\s+containerPort: 9400", template)
    service = yaml.safe_load((root / "k8s" / "base" / "service.yaml").read_text())
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "foxhunt-controller"
    assert "http" in [p["name"] for p in service["spec"]["ports"]]


def test_dashboards_ship_in_a_labelled_configmap(rendered: list[dict[str, Any]]) -> None:
    config_map = _one(rendered, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert re.fullmatch(r"foxhunt-dashboards-[a-z0-9]{10}", config_map["metadata"]["name"]), "name hash kept"
    assert sorted(config_map["data"]) == sorted(p.name for p in DASHBOARDS)
    for name, text in config_map["data"].items():
        assert json.loads(text) == json.loads((COMPONENT / "dashboards" / name).read_text())
    kubernetes_validate.validate(config_map, "1.37.0", strict=True)


def test_dashboards_validate_against_the_grafana_schema() -> None:
    schema = json.loads(upstream.GRAFANA_DASHBOARD_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    for name, dashboard in dashboards().items():
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(dashboard)]
        assert not errors, f"{name}: {errors[:5]}"
    assert list(validator.iter_errors({**dashboard, "style": "dark"})), "the schema check cannot fail"


def test_dashboards_have_the_required_panels_and_variables() -> None:
    boards = dashboards()
    assert {b["uid"] for b in boards.values()} == {"foxhunt-training", "foxhunt-plans"}
    for board in boards.values():
        names = {v["name"] for v in board["templating"]["list"]}
        assert {"job", "pool"} <= names
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{board['uid']}: duplicate panel ids"
    training = boards["foxhunt-training"]
    titles = " | ".join(p["title"] for p in training["panels"])
    for needed in ("breakdown", "Epoch time", "Losses", "Guard", "Replay", "GPU memory"):
        assert needed in titles, needed
    (breakdown,) = [p for p in training["panels"] if "breakdown" in p["title"]]
    assert breakdown["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    plans = " | ".join(p["title"] for p in boards["foxhunt-plans"]["panels"])
    assert "Speed-up over eager" in plans and "by plan" in plans


def test_prometheus_rule_names_the_four_alerts() -> None:
    alerts = [rule["alert"] for group in prometheus_rule_groups() for rule in group["rules"] if "alert" in rule]
    assert sorted(alerts) == sorted(ALERTS)


def _write_rules(tmp_path: Path, groups: list[dict[str, Any]]) -> Path:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    return rules


def _promtool_test(promtool: str, tmp_path: Path, rules: Path) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "rules_test.yaml"
    test.write_text(RULES_TEST.read_text().replace("  - RULES", f"  - {rules}"))
    return subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, check=False)


def test_promtool_checks_and_unit_tests_pass(prometheus_binaries: dict[str, str], tmp_path: Path) -> None:
    rules = _write_rules(tmp_path, prometheus_rule_groups())
    check = subprocess.run(
        [prometheus_binaries["promtool"], "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    tested = _promtool_test(prometheus_binaries["promtool"], tmp_path, rules)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


@pytest.mark.parametrize("alert", ALERTS)
def test_promtool_tests_fail_without_each_alert(
    prometheus_binaries: dict[str, str], tmp_path: Path, alert: str
) -> None:
    """Each alert has a case where it must fire: removing it breaks the unit tests."""
    groups = [
        {**group, "rules": [rule for rule in group["rules"] if rule.get("alert") != alert]}
        for group in prometheus_rule_groups()
    ]
    tested = _promtool_test(prometheus_binaries["promtool"], tmp_path, _write_rules(tmp_path, groups))
    assert tested.returncode != 0
    assert alert in tested.stdout + tested.stderr
