"""Pools files: validation with one-line errors, quotas."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import QuotaExceeded, UnknownPool
from service.pools import Pool, Pools
from tests.service.factories import POOLS_YAML


def test_load_reads_every_field(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS_YAML)
    pools = Pools.load(path)
    h200 = pools.get("h200")
    assert h200.gpus_per_node == 8 and h200.queue_name == "foxhunt-h200"
    assert h200.tolerations[0].operator == "Exists" and h200.node_selector == {"foxhunt.io/pool": "h200"}
    assert pools.default == "cpu"
    with pytest.raises(UnknownPool, match="unknown pool 'a100'; configured: cpu, h200"):
        pools.get("a100")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: [", "is not valid YAML"),
        ("pools: []", "pools: List should have at least 1 item"),
        ("pools: [{name: X, gpu_type: a, gpus_per_node: 1}]", "pools.0.name: String should match pattern"),
        ("pools: [{name: a, gpu_type: a, gpus_per_node: 1, extra: 1}]", "pools.0.extra: Extra inputs"),
    ],
)
def test_bad_pools_files_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        Pools.load(path)
    assert "\n" not in str(error.value)


def test_missing_file_and_duplicate_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pools file not found"):
        Pools.load(tmp_path / "none.yaml")
    pool = Pool(name="a", gpu_type="x", gpus_per_node=1)
    with pytest.raises(ValueError, match="duplicate pool names: a"):
        Pools([pool, pool])


def test_quota_is_per_tenant_with_a_default() -> None:
    pool = Pool(name="a", gpu_type="x", gpus_per_node=4, quota_gpus={"big": 8}, default_quota_gpus=4)
    pool.check_quota(tenant="big", used=4)
    with pytest.raises(QuotaExceeded, match="tenant big uses 8 of 8 GPUs on pool a; a job needs 4 more"):
        pool.check_quota(tenant="big", used=8)
    with pytest.raises(QuotaExceeded):
        pool.check_quota(tenant="small", used=1)
    Pool(name="b", gpu_type="x", gpus_per_node=8).check_quota(tenant="any", used=10_000)  # no quota set


def test_placement_is_the_pools_selector_tolerations_and_gpu_resource(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS_YAML + "    gpu_resource: amd.com/gpu\n")
    placement = Pools.load(path).get("h200").placement()
    assert placement.model_dump() == {
        "node_selector": {"foxhunt.io/pool": "h200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "gpu_resource": "amd.com/gpu",
        "gpus": 8,
    }
    assert Pool(name="a", gpu_type="x", gpus_per_node=1).placement().gpu_resource == "nvidia.com/gpu"
    with pytest.raises(ValueError, match="gpu_resource: String should match pattern"):
        path.write_text(POOLS_YAML + "    gpu_resource: 'nvidia gpu'\n")
        Pools.load(path)
