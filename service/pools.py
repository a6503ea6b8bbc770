"""GPU pools from a YAML file: where jobs may run, and each tenant's GPU quota there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contracts.yamlfile import read_yaml
from service.domain import Placement
from service.errors import QuotaExceeded, UnknownPool


class Toleration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None


class Pool(BaseModel):
    """One pool. Jobs take whole nodes: a job holds `gpus_per_node` GPUs against the quota."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    gpu_type: str
    gpus_per_node: int = Field(ge=0)
    gpu_resource: str = Field(
        "nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        max_length=253,
        description="Extended resource name of the pool's GPUs (e.g. nvidia.com/gpu, amd.com/gpu).",
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    queue_name: str | None = Field(None, description="Kueue LocalQueue; pods then carry its label.")
    quota_gpus: dict[str, int] = Field(default_factory=dict, description="Per-tenant GPU quota.")
    default_quota_gpus: int | None = Field(None, ge=0, description="Quota of tenants not listed; None: none.")

    def quota_for(self, tenant: str) -> int | None:
        return self.quota_gpus.get(tenant, self.default_quota_gpus)

    def placement(self) -> Placement:
        """Where the pool's GPU steps run: its node selector, tolerations and `gpus_per_node` GPUs."""
        return Placement(
            node_selector=self.node_selector,
            tolerations=[t.model_dump(exclude_none=True) for t in self.tolerations],
            gpu_resource=self.gpu_resource,
            gpus=self.gpus_per_node,
        )

    def check_quota(self, *, tenant: str, used: int) -> None:
        """Raise QuotaExceeded if one more job would exceed the tenant's quota."""
        quota = self.quota_for(tenant)
        if quota is not None and used + self.gpus_per_node > quota:
            raise QuotaExceeded(
                f"tenant {tenant} uses {used} of {quota} GPUs on pool {self.name}; "
                f"a job needs {self.gpus_per_node} more"
            )


class PoolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pools: list[Pool] = Field(min_length=1)


class Pools:
    """The configured pools by name."""

    def __init__(self, pools: list[Pool]) -> None:
        names = [p.name for p in pools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate pool names: {', '.join(duplicates)}")
        self._pools = {p.name: p for p in pools}
        self.default = pools[0].name

    def __iter__(self) -> Any:
        return iter(self._pools.values())

    def get(self, name: str) -> Pool:
        try:
            return self._pools[name]
        except KeyError:
            raise UnknownPool(f"unknown pool {name!r}; configured: {', '.join(self._pools)}") from None

    @classmethod
    def load(cls, path: Path) -> Pools:
        """Read and validate a pools file; one-line ValueError on bad input."""
        data = read_yaml(path, "pools file")
        try:
            return cls(PoolsFile.model_validate(data).pools)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"pools file {path}: {where}: {first['msg']}") from None

    @classmethod
    def local(cls, gpus: int) -> Pools:
        """The one pool of a laptop run: this machine, no quota."""
        return cls([Pool(name="local", gpu_type="cpu" if gpus == 0 else "local-gpu", gpus_per_node=min(gpus, 1))])
