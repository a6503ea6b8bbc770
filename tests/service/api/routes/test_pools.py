"""/v1/pools."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
from tests.service.conftest import Controller
from tests.service.factories import make_settings


def test_pools_show_config_and_the_callers_quota_and_use(controller: Controller) -> None:
    controller.request("POST", "/v1/jobs", json={"pool": "h200", "config": {"run": {"steps": 1}}})
    pools = controller.request("GET", "/v1/pools").json()
    assert [p["name"] for p in pools] == ["cpu", "h200"]
    h200 = pools[1]
    assert h200 == {
        "name": "h200",
        "gpu_type": "H200",
        "gpus_per_node": 8,
        "gpu_resource": "nvidia.com/gpu",
        "node_selector": {"foxhunt.io/pool": "h200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": None, "effect": "NoSchedule"}],
        "queue_name": "foxhunt-h200",
        "quota_gpus": 8,
        "used_gpus": 8,
    }
    bobs = controller.request("GET", "/v1/pools", as_="bob").json()[1]
    assert (bobs["quota_gpus"], bobs["used_gpus"]) == (0, 0)


def test_without_a_pools_file_there_is_one_local_pool_and_dev_mode_needs_no_token(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, pools_file=None, auth_disabled=True, run_reconciler=False)
    with TestClient(create_app(settings)) as client:
        pools = client.get("/v1/pools").json()
        assert [(p["name"], p["gpu_type"], p["quota_gpus"]) for p in pools] == [("local", "cpu", None)]
        job = client.post("/v1/jobs", json={"config": {"run": {"steps": 1}}}).json()
        assert (job["tenant"], job["pool"]) == ("default", "local")
