"""/v1/pools: where jobs can run, with the caller's quota and use."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import PoolsDep, StoreDep, TenantDep
from service.api.errors import problems
from service.api.routes import V1
from service.api.schemas import PoolPublic

router = APIRouter(prefix=f"{V1}/pools", tags=["pools"], responses=problems(401))


@router.get("")
def list_pools(principal: TenantDep, pools: PoolsDep, store: StoreDep) -> list[PoolPublic]:
    """Each pool as configured (its own tenant quotas left out), with the caller's quota and use."""
    return [
        PoolPublic.model_validate(
            {
                **pool.model_dump(exclude={"quota_gpus", "default_quota_gpus"}),
                "quota_gpus": pool.quota_for(principal.tenant),
                "used_gpus": store.gpu_use(tenant=principal.tenant, pool=pool.name),
            }
        )
        for pool in pools
    ]
