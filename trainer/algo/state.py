"""TrainState: every tensor the update reads or writes, allocated once with static shapes.

Plans capture the step over these exact tensors, so updates are in place (`copy_`) and nothing is
reallocated; checkpoints save `tensors()` by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from contracts.config import TrainConfig
from trainer.algo.budgets import AdamMoments, pruning_mask, spectral_v_init
from trainer.algo.model import ModelDims, ParamLayout, attn_layout, iql_layout, main_layout, support
from trainer.runtime.checkpoint import CheckpointError


@dataclass
class TrainState:
    dims: ModelDims
    main: ParamLayout
    iql: ParamLayout
    attn: ParamLayout
    online: Tensor  # [Pm] main network (gradients come from torch.func, not autograd leaves)
    target: Tensor  # [Pm] EMA of online
    adam_main: AdamMoments
    iql_params: Tensor  # [Pq]
    adam_iql: AdamMoments
    attn_params: Tensor  # [Pa]
    adam_attn: AdamMoments
    prune_mask: Tensor  # [Pm] 1 keep / 0 pruned
    spectral_v: Tensor  # [ΣC] power iteration: each matrix's right singular-vector estimate
    updates: Tensor  # [] float: accepted updates, Adam's t
    guard_skips: Tensor  # [] int64: updates skipped by the guard
    causal_effects: Tensor  # [F] last causal intervention effect per feature
    atoms: Tensor  # [N] the value support

    @classmethod
    def create(cls, config: TrainConfig, dims: ModelDims, device: torch.device) -> TrainState:
        generator = torch.Generator().manual_seed(config.run.seed)
        main, iql, attn = main_layout(dims), iql_layout(dims), attn_layout(dims)
        mask = pruning_mask(main, config.optim.prune_sparsity, generator, device)
        online = main.init(generator, device) * mask
        return cls(
            dims=dims,
            main=main,
            iql=iql,
            attn=attn,
            online=online,
            target=online.clone(),
            adam_main=AdamMoments.zeros(main.size, device),
            iql_params=iql.init(generator, device),
            adam_iql=AdamMoments.zeros(iql.size, device),
            attn_params=attn.init(generator, device),
            adam_attn=AdamMoments.zeros(attn.size, device),
            prune_mask=mask,
            spectral_v=spectral_v_init(main, generator, device),
            updates=torch.zeros((), device=device),
            guard_skips=torch.zeros((), dtype=torch.int64, device=device),
            causal_effects=torch.zeros(dims.obs_dim, device=device),
            atoms=support(dims, device),
        )

    def tensors(self) -> dict[str, Tensor]:
        """Every stateful tensor by a stable name (checkpoints, equivalence tests)."""
        return {
            "online": self.online,
            "target": self.target,
            "adam_main.m": self.adam_main.m,
            "adam_main.v": self.adam_main.v,
            "iql": self.iql_params,
            "adam_iql.m": self.adam_iql.m,
            "adam_iql.v": self.adam_iql.v,
            "attn": self.attn_params,
            "adam_attn.m": self.adam_attn.m,
            "adam_attn.v": self.adam_attn.v,
            "prune_mask": self.prune_mask,
            "spectral_v": self.spectral_v,
            "updates": self.updates,
            "guard_skips": self.guard_skips,
            "causal_effects": self.causal_effects,
        }

    @torch.no_grad()
    def layout_record(self) -> dict[str, list[list[str | int]]]:
        """Where each named parameter sits in the flat tensors, in memory order, and its stored shape (padded
        dimensions rounded up, `trainer.algo.model.ALIGN`): [name, start, end, *shape]. Stored with a checkpoint,
        whose flat tensors mean nothing under another layout (same sizes, other order: scrambled weights)."""
        layouts = {"main": self.main, "iql": self.iql, "attn": self.attn}
        return {
            name: [[param, start, end, *layout.stored[param]] for param, (start, end) in layout.offsets.items()]
            for name, layout in layouts.items()
        }

    def check_layout(self, record: dict[str, list[list[str | int]]] | None) -> None:
        """Refuse a checkpoint whose parameters were laid out otherwise (it would load without an error)."""
        if record is None:
            raise CheckpointError(
                "the checkpoint has no parameter layout record (written before 2026-12-03, when the heads' "
                "first layers were merged): resume it with the code that wrote it, or start a new run"
            )
        for name, want in self.layout_record().items():
            got = record.get(name)
            if got != want:
                where = next(
                    (
                        f"{g[0]} at {g[1]}:{g[2]} {tuple(g[3:])} there, {w[0]} at {w[1]}:{w[2]} {tuple(w[3:])} here"
                        for g, w in zip(got or [], want, strict=False)  # a length change is said below
                        if g != w
                    ),
                    f"{len(got or [])} parameters there, {len(want)} here",
                )
                raise CheckpointError(
                    f"the checkpoint's {name} parameters are laid out differently ({where}): "
                    "resume it with the code that wrote it, or start a new run"
                )

    def load_tensors(self, tensors: dict[str, Tensor]) -> None:
        own = self.tensors()
        if "spectral_v" not in tensors and "spectral_u" in tensors:
            # Written before 2026-12-05, when spectral norm carried each matrix's left vector u [R]; it now
            # carries the right one, v [C]. The vector is the power iteration's running estimate, not a
            # parameter: this state's fresh one converges again within a few updates.
            tensors = {**tensors, "spectral_v": own["spectral_v"]}
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise ValueError(f"checkpoint lacks state tensors: {', '.join(missing)}")
        for name, tensor in own.items():
            if tensors[name].shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {name} has shape {tuple(tensors[name].shape)}, "
                    f"this model needs {tuple(tensor.shape)}"
                )
            tensor.copy_(tensors[name])

    def parameter_count(self) -> dict[str, int]:
        return {"main": self.main.size, "iql": self.iql.size, "attn": self.attn.size}
