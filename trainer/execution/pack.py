"""Packs: K runs of one configuration in one process and one step (issue 31).

The model is small and its step latency-bound, so one run leaves most of a GPU idle. A pack runs K runs
that share a configuration but differ in seed and in numeric hyper-parameters (`PACKABLE`) as one: every
stateful tensor (parameters, Adam moments, replay storage and priorities) gains a leading run dimension
[K, ...], and one update of the pack is `train_step` (and the replay's sampling and write-back) batched
over the runs with `torch.func.vmap`. Under vmap each of the step's products over stacked weights is one
batched product for all K runs, so a pack step launches about as many kernels as one run's step.

Like the plans, this is how the step runs, not what it computes: run i of a pack is the solo run with the
same config (seed, hyper-parameters). What differs is rounding where a batched kernel sums in another order
(`tests/trainer/execution/test_pack.py` states which tensors and by how much).

- Each run keeps its own objects (`Pack.states`, `Pack.replays`), whose tensors are views of row i of the
  stacked ones: what the solo code does with a run (collect into its replay, act, evaluate, checkpoint)
  it does through them, and the pack's step sees it.
- Each run keeps its own generators (the replay's and the draws'), so it draws exactly the numbers its
  solo run draws: K draw kernels per step, the only per-run launches of the pack step.
- A hyper-parameter that differs between runs reaches the step as a float64 0-d tensor per run (vmap hands
  each run its own), one that is the same in every run stays a Python float, as in a solo run.
- `PackPlan` runs a pack step eagerly or, like the graph plan, captured in one CUDA graph per pattern of
  periodic flags, K = `run.steps_per_replay` updates per replay; eager's kernels, or (`compiled`, the fused
  plans' way) Inductor's, in the precision `run.precision` gives (bf16 autocast too). The fused plans' own
  Triton kernels (window attention) have no vmap rule: a pack runs attention as `pack_attention`.
- Every op of the vmapped step has a batching rule (`tests/trainer/execution/test_pack.py` fails on any op that
  takes vmap's fallback, which loops over the runs with one kernel per run and op). The one op of the step
  that had none is attention (`scaled_dot_product_attention`: its CUDA backward, and both directions on the
  CPU); the pack runs it as `pack_attention`, whose vmap rule hands all K runs' rows to one call.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as fn
from torch import Tensor

from contracts.config import TrainConfig
from contracts.packs import PackError, check_packable
from trainer.algo.batch import Batch
from trainer.algo.budgets import AdamMoments
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.replay.sampler import PrioritizedSampler, sum_paths
from trainer.algo.rng import UNIFORM, rows_draw_
from trainer.algo.state import TrainState
from trainer.algo.step import Draws, Hyper, StepFlags, train_step
from trainer.execution.plans._capture import capture, flag_patterns, matmul_precision, require_cuda, uses_tf32
from trainer.execution.split_k import SplitLongRows

SAMPLER_FIELDS = ("alpha", "beta_start", "beta_end")
"""`PrioritizedSampler` attributes that `PACKABLE`'s replay fields set (same names as the config's)."""


# ---- one run's objects over given tensors ----------------------------------------------------------------


def state_tensors(state: TrainState) -> dict[str, Tensor]:
    """The state's tensors a pack stacks: `TrainState.tensors()` (the support `atoms` is shared)."""
    return state.tensors()


def state_over(template: TrainState, tensors: dict[str, Tensor]) -> TrainState:
    """`template` with its tensors replaced by `tensors` (by `TrainState.tensors()` name)."""
    return dataclasses.replace(
        template,
        online=tensors["online"],
        target=tensors["target"],
        adam_main=AdamMoments(tensors["adam_main.m"], tensors["adam_main.v"]),
        iql_params=tensors["iql"],
        adam_iql=AdamMoments(tensors["adam_iql.m"], tensors["adam_iql.v"]),
        attn_params=tensors["attn"],
        adam_attn=AdamMoments(tensors["adam_attn.m"], tensors["adam_attn.v"]),
        prune_mask=tensors["prune_mask"],
        spectral_v=tensors["spectral_v"],
        updates=tensors["updates"],
        guard_skips=tensors["guard_skips"],
        causal_effects=tensors["causal_effects"],
    )


def _set(obj: object, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(obj, name, value)


def replay_over(
    template: ReplayBuffer, storage: dict[str, Tensor], sampler: dict[str, Tensor], scalars: dict[str, Any]
) -> ReplayBuffer:
    """A shallow copy of `template` whose storage and sampler read `storage` and `sampler` (by their
    `state_dict` names), with the sampler's `scalars` (alpha, beta) replaced: what sampling and the
    priority write-back of one run see inside the pack's vmap."""
    replay = copy.copy(template)
    replay.storage = copy.copy(template.storage)
    replay.sampler = copy.copy(template.sampler)
    _set(replay.storage, storage)
    _set(replay.sampler, {**sampler, **scalars})
    if replay.sampler.search == "tree":
        setattr(replay.sampler, "_sum_levels", functools.partial(sum_written_paths, replay.sampler))  # noqa: B010
    return replay


def sum_written_paths(sampler: PrioritizedSampler, written: Tensor | None = None) -> None:
    """`PrioritizedSampler._sum_levels` inside the pack's vmap: only the ancestors of the `written` leaves [M], level
    by level (`sum_paths`: the values whole levels give, since every other node already holds its children's sum).

    A whole level written into the traced update becomes, once functionalised, a copy of every run's whole tree:
    Inductor swept [K, 2P] once for every level or two (on the CPU at K = 16 and 100,000 slots, the compiled update's
    costliest kernel: 85 of 260 ms, docs/benchmarks/README.md, packs round 9). A path costs M·log2(P). Without
    `written` (a tree from a checkpoint), every level, copied in: vmap has no rule for the whole levels' reduction
    into `out=`."""
    if written is not None:
        sum_paths(sampler.tree[None], torch.zeros_like(written), written, sampler.depth)
        return
    for depth in range(sampler.depth - 1, -1, -1):
        children = sampler.tree[2 << depth : 4 << depth].view(-1, 2)  # [2^d, 2]
        sampler.tree[1 << depth : 2 << depth] = children[:, 0] + children[:, 1]


def hyper_over(template: Hyper, values: dict[str, Tensor]) -> Hyper:
    """`template` with the hyper-parameters that differ between runs (`Pack.hyper`) taken from `values`."""
    # Tensors where Hyper declares floats: the step's arithmetic takes either, and under vmap each run sees its
    # own. float64, as Python's floats are: lr and γ so give the solo run's updates bit for bit (the tests).
    budgets = {name[len("budgets.") :]: value for name, value in values.items() if name.startswith("budgets.")}
    plain: dict[str, Any] = {name: value for name, value in values.items() if not name.startswith("budgets.")}
    if budgets:
        plain["budgets"] = {**template.budgets, **budgets}
    return dataclasses.replace(template, **plain)


def hyper_values(hypers: Sequence[Hyper]) -> dict[str, list[float]]:
    """The numeric Hyper fields (a budget as "budgets.NAME") whose values differ between `hypers`."""
    rows: list[dict[str, Any]] = []
    for hp in hypers:
        row = {f.name: getattr(hp, f.name) for f in dataclasses.fields(hp) if f.name != "budgets"}
        row |= {f"budgets.{name}": value for name, value in hp.budgets.items()}
        rows.append(row)
    differing = [name for name in rows[0] if any(row[name] != rows[0][name] for row in rows[1:])]
    for name in differing:
        if not all(isinstance(row[name], float) for row in rows):
            raise PackError(f"hyper-parameter {name} differs between the runs and is not a number")
    return {name: [row[name] for row in rows] for name in differing}


# ---- attention with a batching rule -----------------------------------------------------------------------


@torch.library.custom_op("foxhunt::pack_attention", mutates_args=())
def pack_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """`scaled_dot_product_attention(q, k, v)` as one opaque op with a vmap rule. vmap has no batching rule for
    attention's CUDA backward (nor either direction on the CPU) and would loop over the runs, one kernel per run;
    here the runs become one more leading batch dimension of the same kernel (attention takes any leading
    dimensions). Opaque, so that a traced pack step (`PackPlan(compiled=True)`) keeps attention as the one kernel
    it is: decomposed, Inductor's fused-attention patterns miscompiled its softmax (torch 2.13, CPU: the
    attention loss 3% off from the first update; `tests/trainer/execution/test_pack.py`)."""
    return fn.scaled_dot_product_attention(q, k, v)


@pack_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


class PackedAttention(torch.autograd.Function):
    """Autograd for `pack_attention`, as an autograd.Function because that is what torch.func's transforms (the
    step's `grad_and_value` under the pack's vmap) differentiate; vmap reaches `pack_attention`'s own rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return pack_attention(q, k, v)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Attention's gradients written out (the forward recomputed): plain products and a softmax, whose vmap
        rules batch the runs, where attention's own backward has none."""
        q, k, v = ctx.saved_tensors  # [..., W, d] each
        scale = q.shape[-1] ** -0.5
        p = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # [..., W, W]
        grad_v = p.transpose(-2, -1) @ grad
        grad_p = grad @ v.transpose(-2, -1)  # [..., W, W]
        grad_s = p * (grad_p - (grad_p * p).sum(dim=-1, keepdim=True))  # through the softmax
        return grad_s @ k * scale, grad_s.transpose(-2, -1) @ q * scale, grad_v


def runs_first(tensor: Tensor, dim: int | None, size: int) -> Tensor:
    """`tensor` with vmap's run dimension `dim` moved to the front (expanded to `size` runs if it has none)."""
    return tensor.expand(size, *tensor.shape) if dim is None else tensor.movedim(dim, 0)


@pack_attention.register_vmap
def _(info: Any, in_dims: tuple[int | None, ...], q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, int]:
    moved = (runs_first(t, d, info.batch_size) for t, d in zip((q, k, v), in_dims, strict=True))
    return pack_attention(*moved), 0


def packed_self_attention(qkv: Tensor) -> Tensor:
    """`trainer.algo.model.self_attention` through `PackedAttention`: the pack's `Hyper.attend`."""
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 × [B, h, W, d]
    out: Tensor = PackedAttention.apply(q, k, v)
    return out.transpose(1, 2)  # [B, W, h, d]


# ---- the pack ---------------------------------------------------------------------------------------------


class PackRun(NamedTuple):
    """One run's objects, made as its solo run makes them (so it starts where its solo run starts)."""

    state: TrainState
    replay: ReplayBuffer
    generator: torch.Generator
    """The step's draws (`Draws.fill_`'s generator; the replay has its own, or shares this one)."""


class Pack:
    """K runs' states, replays and generators, their tensors stacked along a leading run dimension.

    `make(i, config)` builds run i's objects as its solo run would; their tensors are copied into row i of the
    stacked ones as each run comes (so the peak is the stack and one run), and run i's objects are pointed at
    that row: `states[i]` and `replays[i]` stay usable as a solo run's are.
    """

    def __init__(self, configs: Sequence[TrainConfig], make: Callable[[int, TrainConfig], PackRun]) -> None:
        self.differing = check_packable(configs)
        self.configs = list(configs)
        self.size = len(configs)
        self.states: list[TrainState] = []
        self.replays: list[ReplayBuffer] = []
        self.generators: list[torch.Generator] = []
        self.state: dict[str, Tensor] = {}
        self.storage: dict[str, Tensor] = {}
        self.sampler: dict[str, Tensor] = {}
        for i, config in enumerate(configs):
            run = make(i, config)
            self._add(i, self.state, state_tensors(run.state), functools.partial(self._point_state, run.state))
            self._add(i, self.storage, run.replay.storage.state_dict(), functools.partial(_set, run.replay.storage))
            self._add(i, self.sampler, run.replay.sampler.state_dict(), functools.partial(_set, run.replay.sampler))
            self.states.append(run.state)
            self.replays.append(run.replay)
            self.generators.append(run.generator)
        self.device = self.states[0].atoms.device
        self.hyper = {
            name: torch.tensor(values, dtype=torch.float64, device=self.device)
            for name, values in hyper_values([Hyper.from_config(c) for c in configs]).items()
        }  # name -> [K]: only the step's hyper-parameters that differ between the runs
        self.sampler_scalars = {
            name: torch.tensor(
                [getattr(r.sampler, name) for r in self.replays], dtype=torch.float64, device=self.device
            )
            for name in SAMPLER_FIELDS
            if any(getattr(r.sampler, name) != getattr(self.replays[0].sampler, name) for r in self.replays)
        }  # name -> [K]

    @classmethod
    def of(cls, configs: Sequence[TrainConfig], runs: Sequence[PackRun]) -> Pack:
        """A pack of runs already built (the peak is then every run and the stack)."""
        if len(configs) != len(runs):
            raise PackError(f"a pack needs one run per config, got {len(runs)} runs for {len(configs)} configs")
        return cls(configs, lambda i, _: runs[i])

    def _add(
        self, i: int, stacked: dict[str, Tensor], tensors: dict[str, Tensor], point: Callable[[dict[str, Tensor]], None]
    ) -> None:
        """Copy run i's `tensors` into row i of `stacked` (allocated by run 0), then point the run at its row."""
        for name, tensor in tensors.items():
            if i == 0:
                stacked[name] = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
            if tensor.shape != stacked[name].shape[1:]:
                raise PackError(
                    f"run {i}'s {name} has shape {tuple(tensor.shape)}, run 0's {tuple(stacked[name].shape[1:])}"
                )
            stacked[name][i].copy_(tensor)
        point({name: stacked[name][i] for name in tensors})

    @staticmethod
    def _point_state(state: TrainState, tensors: dict[str, Tensor]) -> None:
        moved = state_over(state, tensors)
        for field in dataclasses.fields(state):
            setattr(state, field.name, getattr(moved, field.name))

    def tensors(self) -> dict[str, Tensor]:
        """Every stacked tensor by a stable name ([K, ...]): snapshots, equivalence checks."""
        named = {f"state.{n}": t for n, t in self.state.items()}
        named |= {f"replay.storage.{n}": t for n, t in self.storage.items()}
        return named | {f"replay.sampler.{n}": t for n, t in self.sampler.items()}


class PackOutput(NamedTuple):
    losses: dict[str, Tensor]  # name -> [K]
    priority: Tensor  # [K, B]
    ok: Tensor  # [K] bool: each run's guard


PACK_COMBO_OPTIONS: dict[str, Any] = {"combo_kernels": True, "benchmark_combo_kernel": False}
"""Inductor's options for a pack under `run.combo_kernels`: the solo plans' (`HORIZONTAL_OPTIONS`) but every
combination kept, unmeasured. Inductor's compile-time benchmark of a combination runs it on made-up inputs, from
which the pack's sampling computes indices out of its replay, and the failed index assert ends the process
(torch 2.11 on an H100 and an H200, `docs/benchmarks/README.md`, packs rounds 7 and 8); without the benchmark
the market's pack trains (round 10)."""


class PackPlan:
    """A pack's updates: per update, each run's draws (its own generators), then sampling, `train_step` and
    the priority write-back of all K runs in one vmapped call. `graph=True` captures K = `run.steps_per_replay`
    updates per CUDA graph replay (one graph per pattern of periodic flags), as the graph plan does.

    `compiled=True` runs the vmapped update through Inductor, as the fused plans run `train_step`: Dynamo cannot
    trace vmap over the step's torch.func transforms and attention's autograd.Function, so the update is first
    traced to one graph of aten ops (`make_fx`: vmap and the gradients become plain batched ops) and that graph
    is compiled, one per `StepFlags` (`compiled_update`), with Inductor's defaults, or under `run.combo_kernels` with
    its combined kernels as `PACK_COMBO_OPTIONS` set them, and under `run.pack_split_k` with its batched products
    over long rows split (`trainer.execution.split_k`). Its C51 target is the fused plans' kernel where the runs
    share γ (`c51_kernel_fits`), and its IQN head's the fused plans' kernels where they would take them
    (`iqn_kernels`)."""

    def __init__(self, pack: Pack, graph: bool = False, compiled: bool = False) -> None:
        self.pack, self.config = pack, pack.configs[0]
        self.device = pack.device
        self.graph, self.compiled = graph, compiled
        self.name = f"pack-{('fused' if graph else 'compile') if compiled else ('graph' if graph else 'eager')}"
        self.compiled_updates: dict[StepFlags, Callable[..., PackOutput]] = {}
        self.split_k = SplitLongRows()  # run.pack_split_k: the products it rewrote, in `split_k.rewritten`
        self.tf32 = uses_tf32(self.config.run.precision, compiled)  # compiled: TF32, as the fused plan
        self.hp = dataclasses.replace(Hyper.from_config(self.config), attend=packed_self_attention)
        if compiled and self.c51_kernel_fits(self.config, pack.hyper, self.device):
            from trainer.execution.kernels.c51 import c51_target

            self.hp = dataclasses.replace(self.hp, c51_target=c51_target)
        if compiled:
            dims = pack.states[0].dims
            kernels = self.iqn_kernels(self.config, pack.hyper, self.device, dims.branches * dims.actions)
            self.hp = dataclasses.replace(self.hp, **kernels)
        self.batch_size = self.config.run.batch_size
        template = pack.replays[0].empty_batch(self.batch_size)
        self.batch = {name: torch.stack([t] * pack.size) for name, t in vars(template).items()}  # name -> [K, ...]
        draws = Draws.empty(pack.states[0].dims, self.batch_size, self.device, permute=self.config.loss.causal)
        self.permute = draws.permute
        self.uniform = torch.stack([draws.uniform] * pack.size)  # [K, B·T + B·T' + B]
        self.perm = torch.stack([draws.perm] * pack.size)  # [K, B]
        self.taus = draws.tau.numel(), draws.tau_target.numel()
        self.last: PackOutput | None = None
        self.steps_per_call = self.config.run.steps_per_replay if graph else 1
        if graph:
            require_cuda("pack", self.device)
            if any(r.her is not None and not r.her.goal.capturable for r in pack.replays):
                raise PackError("a packed graph samples in the graph: this env's HER goal reward calls the host")
            self.step_base = torch.zeros((), dtype=torch.int64, device=self.device)
            self.step_offsets = torch.arange(self.steps_per_call, dtype=torch.int64, device=self.device)
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(self.device)
            self.graphs: dict[tuple[StepFlags, ...], tuple[torch.cuda.CUDAGraph, PackOutput]] = {}
            self.capture_patterns(flag_patterns(self.config, self.steps_per_call))

    @staticmethod
    def c51_kernel_fits(config: TrainConfig, differing: Collection[str], device: torch.device) -> bool:
        """Whether a compiled pack computes the C51 target with the solo fused plans' kernel: on a GPU (Triton's), as
        `run.c51_target_kernel` chooses for them (auto, triton), and where no run's γ differs (`differing`: the
        hyper-parameters that do), since the kernel takes γ as a number."""
        if device.type != "cuda" or config.run.c51_target_kernel == "inductor" or "gamma" in differing:
            return False
        from trainer.execution.kernels import c51  # Triton: imported only where it runs

        return c51.supports(config.model.atoms)

    @staticmethod
    def iqn_kernels(
        config: TrainConfig, differing: Collection[str], device: torch.device, outputs: int
    ) -> dict[str, Any]:
        """The IQN kernels a compiled pack runs (`Hyper` fields), as the solo fused plans choose them
        (`FusedPlan.iqn_kernel_chosen`, `run.iqn_online_kernel`), on a GPU; under vmap a pack's runs are one
        launch. The target kernel only where no run's γ differs, since it takes γ as a number."""
        if device.type != "cuda":
            return {}
        from trainer.execution.kernels import iqn  # Triton: imported only where it runs
        from trainer.execution.plans.fused import FusedPlan

        kernels: dict[str, Any] = {}
        if "gamma" not in differing and FusedPlan.iqn_kernel_chosen(config, outputs):
            kernels["iqn_target"] = iqn.next_quantile_targets_fused
        if config.run.iqn_online_kernel == "triton":
            kernels["iqn_online"] = iqn.quantiles_at_fused
        return kernels

    COMPILED_PLANS = frozenset({"compile", "fused", "zerocopy"})
    """Solo plans whose step runs through Inductor: their runs' pack does too."""

    @classmethod
    def for_plan(cls, pack: Pack, plan: str) -> PackPlan:
        """The pack plan nearest solo plan `plan`: captured unless eager (or compile, which is eager's loop),
        through Inductor where the solo plan is."""
        return cls(pack, graph=plan not in ("eager", "compile"), compiled=plan in cls.COMPILED_PLANS)

    # ---- what one update of the pack runs ------------------------------------------------------------------

    def one_run(
        self,
        flags: StepFlags,
        state: dict[str, Tensor],
        storage: dict[str, Tensor],
        sampler: dict[str, Tensor],
        scalars: dict[str, Tensor],
        hyper: dict[str, Tensor],
        batch: dict[str, Tensor],
        uniform: Tensor,
        perm: Tensor,
        points: Tensor,
        her: Tensor | None,
        step: Tensor,
    ) -> PackOutput:
        """One run's update, as its solo plan runs it (`GraphPlan.body`), over one run's tensors: vmap's body."""
        pack = self.pack
        replay = replay_over(pack.replays[0], storage, sampler, scalars)
        run_batch = Batch(**batch)
        replay.gather_into(run_batch, points, her, step)
        taus, target_taus = self.taus
        draws = Draws(
            tau=uniform[:taus].view(self.batch_size, -1),
            tau_target=uniform[taus : taus + target_taus].view(self.batch_size, -1),
            perm=perm,
            uniform=uniform,
            permute=False,  # drawn by `draw` for all runs at once
        )
        output = train_step(state_over(pack.states[0], state), run_batch, draws, hyper_over(self.hp, hyper), flags)
        replay.update_priorities(run_batch.index, output.priority)
        return PackOutput(output.losses, output.priority, output.ok)

    def draw(self) -> tuple[Tensor, Tensor | None]:
        """Every run's random numbers from its own generators, in its solo run's order: PER's points [K, B]
        and HER's [K, 2, B] (the replay's), then the step's uniforms (`Draws.fill_`'s)."""
        points, her = ReplayBuffer.draw_rows(self.pack.replays, self.batch_size)
        rows_draw_(self.uniform, self.pack.generators, UNIFORM)
        if self.permute:
            self.perm.copy_(self.uniform[:, -self.batch_size :].argsort(dim=1))
        return points, her

    def vmapped(self, flags: StepFlags, *inputs: Any) -> PackOutput:
        """`one_run` over every run (`inputs`: `update`'s, [K, ...] each but the global step)."""
        in_dims = (0, 0, 0, 0, 0, 0, 0, 0, 0, None if inputs[9] is None else 0, None)
        out: PackOutput = torch.func.vmap(functools.partial(self.one_run, flags), in_dims=in_dims)(*inputs)
        return out

    def compiled_update(self, flags: StepFlags, inputs: tuple[Any, ...]) -> Callable[..., PackOutput]:
        """`vmapped` for `flags` as one Inductor-compiled graph, traced on the first call over copies of
        `inputs` (tracing runs the update: on copies, the pack's state is not advanced by it). The replay's storage
        (`inputs[1]`), which an update only reads, is not copied: K replays' worth of memory."""
        if flags not in self.compiled_updates:
            from torch.fx.experimental.proxy_tensor import make_fx

            from trainer.execution.plans.fused import raise_dynamo_cache_limits

            def copy(tensor: Any) -> Any:
                return tensor.clone() if isinstance(tensor, Tensor) else tensor

            copies = [arg if i == 1 else torch.utils._pytree.tree_map(copy, arg) for i, arg in enumerate(inputs)]
            traced = make_fx(functools.partial(self.vmapped, flags))(*copies)
            raise_dynamo_cache_limits()
            self.compiled_updates[flags] = torch.compile(traced, dynamic=False, options=self.inductor_options())  # type: ignore[assignment]
        return self.compiled_updates[flags]

    def inductor_options(self) -> dict[str, Any]:
        """Inductor's options for the compiled update: combined kernels (`PACK_COMBO_OPTIONS`) under
        `run.combo_kernels`; the long rows' products split (`SplitLongRows`) under `run.pack_split_k`."""
        options: dict[str, Any] = dict(PACK_COMBO_OPTIONS) if self.config.run.combo_kernels else {}
        if self.config.run.pack_split_k:
            options["post_grad_custom_post_pass"] = self.split_k
        return options

    def update(self, flags: StepFlags, step: Tensor) -> PackOutput:
        """One update of every run (`step`: the global step, a 0-d int64 device tensor)."""
        pack = self.pack
        points, her = self.draw()
        inputs = (
            pack.state,
            pack.storage,
            pack.sampler,
            pack.sampler_scalars,
            pack.hyper,
            self.batch,
            self.uniform,
            self.perm,
            points,
            her,
            step,
        )
        with matmul_precision(self.tf32):
            if self.compiled:
                return self.compiled_update(flags, inputs)(*inputs)
            return self.vmapped(flags, *inputs)

    def body(self, pattern: tuple[StepFlags, ...]) -> PackOutput:
        steps = (self.step_base + self.step_offsets).unbind(0)
        output = None
        for flags, step in zip(pattern, steps, strict=False):
            output = self.update(flags, step)
        assert output is not None
        return output

    # ---- capture and replay --------------------------------------------------------------------------------

    def generators(self) -> list[torch.Generator]:
        seen: dict[int, torch.Generator] = {}
        for generator in [*(r.generator for r in self.pack.replays), *self.pack.generators]:
            seen.setdefault(id(generator), generator)
        return list(seen.values())

    def capture_patterns(self, patterns: list[tuple[StepFlags, ...]]) -> None:
        """Capture a graph per pattern; the warm-up's writes (state, priorities, generators) are undone. The replay's
        storage is only read by an update, so it is not copied (K copies of it were the packs' largest cost in
        memory: 0.6 GiB a run at the bench's 1 M transitions)."""
        generators = self.generators()
        written = {name: t for name, t in self.pack.tensors().items() if not name.startswith("replay.storage.")}
        with torch.no_grad():
            saved = {name: t.clone() for name, t in written.items()}
        rng = [g.get_state() for g in generators]
        with matmul_precision(self.tf32):
            for pattern in patterns:
                self.graphs[pattern] = capture(
                    functools.partial(self.body, pattern), self.pool, self.stream, generators
                )
        with torch.no_grad():
            for name, tensor in written.items():
                tensor.copy_(saved[name])
        for generator, state in zip(generators, rng, strict=True):
            generator.set_state(state)
        torch.cuda.synchronize(self.device)

    def run(self, step: int) -> PackOutput:
        """`steps_per_call` updates of every run from global step `step`; the last update's output."""
        if not self.graph:
            flags = StepFlags.for_step(step, self.config)
            self.last = self.update(flags, torch.full((), step, dtype=torch.int64, device=self.device))
            return self.last
        pattern = tuple(StepFlags.for_step(step + i, self.config) for i in range(self.steps_per_call))
        if pattern not in self.graphs:
            self.capture_patterns([pattern])
        graph, output = self.graphs[pattern]
        self.step_base.fill_(step)
        graph.replay()
        self.last = output
        return output
