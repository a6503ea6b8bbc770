"""/v1/pools: where jobs can run, with the caller's quota and use."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import PoolsDep, StoreDep, TenantDep
from service.api.errors import problems
from service.api.routes import V1
from service.api.schemas import PoolPublic, TolerationPublic

router = APIRouter(prefix=f"{V1}/pools", tags=["pools"], responses=problems(401))


@router.get("")
def list_pools(principal: TenantDep, pools: PoolsDep, store: StoreDep) -> list[PoolPublic]:
    return [
        PoolPublic(
            name=pool.name,
            gpu_type=pool.gpu_type,
            gpus_per_node=pool.gpus_per_node,
            gpu_resource=pool.gpu_resource,
            node_selector=pool.node_selector,
            tolerations=[TolerationPublic(**t.model_dump()) for t in pool.tolerations],
            queue_name=pool.queue_name,
            quota_gpus=pool.quota_for(principal.tenant),
            used_gpus=store.gpu_use(tenant=principal.tenant, pool=pool.name),
        )
        for pool in pools
    ]
