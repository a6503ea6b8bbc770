"""Packs (`trainer.pack`): run i of a pack is the solo run with run i's config, and one run's failure stays its own.

Solo runs here are the eager plan's loop (`EagerPlan.run`: sample, draw, `train_step`, write back), which the
graph plan reproduces bit for bit in float32 (`tests/trainer/runtime/test_train_equivalence.py`). What a pack changes
is rounding where vmap's batched kernels sum in another order than one run's: `EXACT` names the tensors that
stay bit-identical on the CPU, `RTOL` bounds the rest (relative norm per tensor).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from contracts.config import TrainConfig
from tests.emulated_capture import CaptureEmulator, emulated_capture  # noqa: F401  (the fixture)
from tests.factories import needs_gpu, tiny_config
from trainer.algo.model import ModelDims
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.rng import KeyedRows, make_generator
from trainer.algo.state import TrainState
from trainer.algo.step import Draws, Hyper, StepFlags, train_step
from trainer.execution.pack import Pack, PackPlan, PackRun
from trainer.execution.split_k import SplitLongRows
from trainer.tools.bench import bench_spec, fill_with_random_transitions, random_run

RTOL = {
    "state.attn": 2e-5,  # the attention model: batched products over [K, B, W, ·]
    "state.adam_attn.m": 2e-5,
    "state.adam_attn.v": 2e-5,
    "state.spectral_v": 2e-5,  # the power iteration's matrix-vector products, batched
    "replay.sampler.tree": 1e-12,  # p^α with α a per-run float64 tensor, not a Python float: pow's other path
}
"""Relative error ‖pack − solo‖ / ‖solo‖ allowed per tensor after the CPU test's updates; every other tensor
must be bit-identical (the main network, its target and Adam moments, IQL, the guard's counters, replay storage)."""

FIRST_REPLAY_RTOL = 1e-6
"""GPU: a captured pack against its solo graph plans after one replay (10 updates), for `state.online` and the
priorities (measured at most 6.1e-8 and 9.4e-9 on an H100)."""

LRS, GAMMAS, ALPHAS = (1e-3, 3e-4, 1e-4), (0.99, 0.95, 0.9), (0.6, 0.5, 0.7)


def run_config(i: int, full: bool, device: str = "cpu", rng: str = "torch") -> TrainConfig:
    """Run i of the test's pack: its own seed, learning rate, γ and PER α."""
    parts = (
        ["loss.vaccine_every=2", "loss.causal_every=3"]
        if full
        else ["loss.vaccine=false", "loss.causal=false", "model.ensemble_heads=0", "replay.her=false"]
    )
    return tiny_config(
        [
            f"run.seed={i}",
            f"run.device={device}",
            f"run.rng={rng}",
            f"optim.lr={LRS[i]}",
            f"loss.gamma={GAMMAS[i]}",
            f"replay.alpha={ALPHAS[i]}",
            "replay.capacity=512",
            f"replay.search={'tree' if full else 'cdf'}",  # both searches: the tree's level sums are written otherwise
            *parts,
        ]
    )


def solo_run(i: int, config: TrainConfig) -> PackRun:
    """Run i as a solo run builds it: state, a replay of random transitions, the draws' generator (`run.rng`'s)."""
    device = torch.device(config.run.device)
    spec = bench_spec(config)
    dims = ModelDims.build(config.model, spec.obs_dim, spec.branches, spec.actions)
    replay = ReplayBuffer(config, spec, device, make_generator(config.run.seed, "step", device, config.run.rng))
    fill_with_random_transitions(replay, 400, seed=7 + i, chunk=200)
    draws = make_generator(100 + i, "step", device, config.run.rng)
    return PackRun(TrainState.create(config, dims, device), replay, draws)


class Solo:
    """A solo run stepped as the eager plan steps it (without its read-back)."""

    def __init__(self, i: int, config: TrainConfig) -> None:
        self.config, self.run = config, solo_run(i, config)
        self.hp = Hyper.from_config(config)
        size = config.run.batch_size
        self.batch = self.run.replay.empty_batch(size)
        self.draws = Draws.empty(self.run.state.dims, size, self.run.state.atoms.device, permute=config.loss.causal)

    def step(self, step: int) -> None:
        self.run.replay.sample_into(self.batch, step)
        self.draws.fill_(self.run.generator)
        out = train_step(self.run.state, self.batch, self.draws, self.hp, StepFlags.for_step(step, self.config))
        self.run.replay.update_priorities(self.batch.index, out.priority)


def run_tensors(state: TrainState, replay: ReplayBuffer) -> dict[str, torch.Tensor]:
    named = {f"state.{n}": t for n, t in state.tensors().items()}
    return named | {f"replay.{n}": t for n, t in replay.state_dict().items()}


def relative_errors(pack: Pack, solos: list[Solo]) -> Iterator[tuple[int, str, float]]:
    """(run, tensor, ‖pack − solo‖ / ‖solo‖) for every tensor of every run that is not bit-identical."""
    for i, solo in enumerate(solos):
        mine = run_tensors(pack.states[i], pack.replays[i])
        for name, want in run_tensors(solo.run.state, solo.run.replay).items():
            got = mine[name]
            if not torch.equal(got, want):
                diff = (got.double() - want.double()).norm() / want.double().norm().clamp(min=1e-30)
                yield i, name, float(diff)


@pytest.mark.parametrize(
    ("full", "rng"), [(False, "torch"), (True, "torch"), (True, "keyed")], ids=["core", "full", "full-keyed"]
)
def test_each_run_of_a_pack_is_its_solo_run(full: bool, rng: str) -> None:
    """Two runs differing in seed, lr, γ and α (with vaccine, causal, ensemble, HER and the sum-tree's descent in
    `full`), 3 updates. Under `run.rng: keyed` the runs' replays and draws are keyed rows of one pack."""
    configs = [run_config(i, full, rng=rng) for i in range(2)]
    solos = [Solo(i, config) for i, config in enumerate(configs)]
    pack = Pack(configs, solo_run)
    assert pack.differing == ["loss.gamma", "optim.lr", "replay.alpha", "run.seed"]
    assert set(pack.hyper) == {"gamma", "lr"} and set(pack.sampler_scalars) == {"alpha"}
    assert (pack.replays[0].her is not None) == full
    plan = PackPlan(pack)
    for step in range(3):
        for solo in solos:
            solo.step(step)
        output = plan.run(step)
    assert output.ok.tolist() == [True, True]
    assert [float(s.updates) for s in pack.states] == [3.0, 3.0]
    errors = list(relative_errors(pack, solos))
    over = [(i, name, err) for i, name, err in errors if err > RTOL.get(name, 0.0)]
    assert not over, f"pack parts from its solo runs: {over}"
    # each run's objects are views of its row of the stacked tensors: what collection writes, the pack step reads
    assert pack.states[1].online.data_ptr() == pack.state["online"][1].data_ptr()
    assert pack.replays[1].storage.obs.data_ptr() == pack.storage["obs"][1].data_ptr()
    if rng == "keyed":  # the replays' generators and the draws' each drew as one: rows of two [K] counters
        replays = KeyedRows.of([r.generator for r in pack.replays])
        assert replays is not None and replays.counters.tolist() == [6, 6]  # PER's and HER's, 3 updates
        assert KeyedRows.of(pack.generators) is not replays and pack.generators[1].counter.item() == 3


@pytest.mark.parametrize("rng", ["torch", "keyed"])
def test_a_captured_pack_and_its_solo_graphs_replay_their_eager_runs(
    rng: str,
    emulated_capture: CaptureEmulator,  # noqa: F811
) -> None:
    """Captures emulated on the CPU (`tests/emulated_capture.py`: the warm-up and its undo as on a GPU, then only
    what the capture recorded replays, the Python that launched it frozen), two runs with HER, vaccine and causal
    (three flag patterns), two replays of 4 updates: each solo graph plan is its eager run bit for bit, and the
    packed graph its solo runs within `RTOL`, with torch's draws and keyed ones through the Triton kernel (the
    interpreter). A keyed packed graph parts from its solo graphs on a GPU (packs round 14); this says that what a
    capture freezes on the host is not why."""
    from trainer.tools.bench import solo_runs_beside_pack

    configs = [run_config(i, True, rng=rng) for i in range(2)]
    configs = [c.model_copy(update={"run": c.run.model_copy(update={"steps_per_replay": 4})}) for c in configs]
    solos = [Solo(i, config) for i, config in enumerate(configs)]
    graphs, plan = solo_runs_beside_pack(configs, solo_run, "graph")
    pack = plan.pack
    assert plan.graph and all(type(graph).__name__ == "GraphPlan" for _, graph in graphs)
    assert isinstance(plan.graphs[next(iter(plan.graphs))][0], emulated_capture.graph_type)
    for step in range(0, 8, 4):
        plan.run(step)
        for _, graph in graphs:
            graph.run(step)
        for update in range(step, step + 4):
            for solo in solos:
                solo.step(update)
    assert [float(s.updates) for s in pack.states] == [8.0, 8.0]
    for (run, _), solo in zip(graphs, solos, strict=True):
        for name, want in run_tensors(solo.run.state, solo.run.replay).items():
            assert torch.equal(run_tensors(run.state, run.replay)[name], want), f"solo graph: {name}"
    over = [(i, name, err) for i, name, err in relative_errors(pack, solos) if err > RTOL.get(name, 0.0)]
    assert not over, f"the captured pack parts from its solo runs: {over}"


COMPILED_RTOL = 1e-4
"""A pack through Inductor (`PackPlan(compiled=True)`) against the eager pack, every tensor, after 3 CPU updates:
fused kernels sum in another order (measured at most 2.9e-6, the attention model's parameters)."""


@pytest.mark.slow
def test_a_compiled_pack_is_the_eager_pack() -> None:
    """The vmapped update traced to aten ops and compiled by Inductor (one compile: the 3 updates share their
    flags) gives the eager pack's losses and state. With attention traced into the graph as products and a
    softmax, Inductor's fused-attention patterns miscompiled it (torch 2.13): the attention loss was 3% off on
    the first update and its Adam moments 37% after three; `pack_attention` keeps it one opaque op."""
    configs = [run_config(i, full=False) for i in range(2)]
    eager, compiled = PackPlan(Pack(configs, solo_run)), PackPlan(Pack(configs, solo_run), compiled=True)
    assert compiled.name == "pack-compile"
    for step in range(3):
        want, got = eager.run(step), compiled.run(step)
        for name, loss in want.losses.items():
            torch.testing.assert_close(got.losses[name], loss, rtol=COMPILED_RTOL, atol=0.0, msg=name)
    assert len(compiled.compiled_updates) == 1
    expected = eager.pack.tensors()
    errors = {
        name: float((tensor.double() - expected[name].double()).norm() / expected[name].double().norm().clamp(1e-30))
        for name, tensor in compiled.pack.tensors().items()
    }
    assert {name: e for name, e in errors.items() if not e <= COMPILED_RTOL} == {}
    assert errors["state.updates"] == 0.0 and errors["state.online"] > 0.0  # 3 updates each; Inductor's own sums


def test_a_compiled_pack_on_a_gpu_takes_the_c51_target_kernel_where_its_runs_share_gamma() -> None:
    """As the fused plans choose it (`run.c51_target_kernel` auto or triton), on a GPU only (on the CPU no Triton
    runs outside the tests' interpreter), and only where γ, which the kernel takes as a number, is every run's."""
    config, cuda, cpu = run_config(0, full=False), torch.device("cuda"), torch.device("cpu")
    assert PackPlan.c51_kernel_fits(config, {"lr": [1e-3, 2e-3]}, cuda)
    assert not PackPlan.c51_kernel_fits(config, {"gamma": [0.9, 0.99]}, cuda)
    assert not PackPlan.c51_kernel_fits(config, {}, cpu)
    inductor = config.model_copy(update={"run": config.run.model_copy(update={"c51_target_kernel": "inductor"})})
    assert not PackPlan.c51_kernel_fits(inductor, {}, cuda)


def test_a_compiled_pack_with_the_c51_target_kernel_is_the_eager_pack() -> None:
    """The C51 target kernel under vmap (`trainer.execution.kernels.c51._over_runs`: the runs' samples as one launch)
    inside the compiled update, here through Triton's interpreter: the eager pack's losses and state after 2
    updates (the eager pack runs the written form)."""
    from trainer.algo.losses.c51 import target_distribution
    from trainer.execution.kernels.c51 import c51_target

    configs = [run_config(i, full=False) for i in range(2)]
    shared = [c.model_copy(update={"loss": configs[0].loss}) for c in configs]
    eager, compiled = PackPlan(Pack(shared, solo_run)), PackPlan(Pack(shared, solo_run), compiled=True)
    assert eager.hp.c51_target is target_distribution
    compiled.hp = dataclasses.replace(compiled.hp, c51_target=c51_target)  # what a GPU's compiled pack chooses
    assert_runs_alike(eager, compiled, updates=2)


def assert_runs_alike(eager: PackPlan, compiled: PackPlan, updates: int) -> None:
    """`updates` updates of both packs: the same losses and state within `COMPILED_RTOL`."""
    for step in range(updates):
        want, got = eager.run(step), compiled.run(step)
        for name, loss in want.losses.items():
            torch.testing.assert_close(got.losses[name], loss, rtol=COMPILED_RTOL, atol=0.0, msg=name)
    expected = eager.pack.tensors()
    for name, tensor in compiled.pack.tensors().items():
        error = (tensor.double() - expected[name].double()).norm() / expected[name].double().norm().clamp(1e-30)
        assert error <= COMPILED_RTOL, name


def test_a_compiled_pack_on_a_gpu_takes_the_iqn_kernels_as_the_fused_plans_choose_them() -> None:
    """The target kernel by `run.iqn_target_kernel` (auto: bf16) where no run's γ differs, the online pair by
    `run.iqn_online_kernel`; on a GPU only."""
    from trainer.execution.kernels.iqn import next_quantile_targets_fused, quantiles_at_fused

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    bf16 = tiny_config(["run.precision=bf16"])
    online = tiny_config(["run.iqn_online_kernel=triton"])
    assert PackPlan.iqn_kernels(bf16, {"lr": [1e-3, 2e-3]}, cuda, 15) == {"iqn_target": next_quantile_targets_fused}
    assert PackPlan.iqn_kernels(bf16, {"gamma": [0.9, 0.99]}, cuda, 15) == {}
    assert PackPlan.iqn_kernels(online, {"gamma": [0.9, 0.99]}, cuda, 15) == {"iqn_online": quantiles_at_fused}
    assert PackPlan.iqn_kernels(bf16, {}, cpu, 15) == {} and PackPlan.iqn_kernels(tiny_config(), {}, cuda, 15) == {}


@pytest.mark.slow
def test_a_compiled_pack_with_the_iqn_kernels_is_the_eager_pack() -> None:
    """The IQN target and online kernels under vmap (`trainer.execution.kernels.iqn._over_runs`: the runs as one
    launch) inside the compiled update, here through Triton's interpreter: the eager pack's losses and state after
    2 updates (the eager pack runs the written forms)."""
    from trainer.execution.kernels.iqn import next_quantile_targets_fused, quantiles_at_fused

    configs = [run_config(i, full=False) for i in range(2)]
    shared = [c.model_copy(update={"loss": configs[0].loss}) for c in configs]
    eager, compiled = PackPlan(Pack(shared, solo_run)), PackPlan(Pack(shared, solo_run), compiled=True)
    assert eager.hp.iqn_target is None and eager.hp.iqn_online is None
    kernels = {"iqn_target": next_quantile_targets_fused, "iqn_online": quantiles_at_fused}
    compiled.hp = dataclasses.replace(compiled.hp, **kernels)  # what a GPU's compiled pack chooses when asked
    assert_runs_alike(eager, compiled, updates=2)


@pytest.mark.parametrize("split_k", [False, True])
@pytest.mark.parametrize("combo", [False, True])
def test_a_compiled_pack_takes_combined_kernels_and_split_products_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, combo: bool, split_k: bool
) -> None:
    """The pack's traced update goes to Inductor with its defaults; under `run.combo_kernels` with combined
    kernels but not their compile-time benchmark, under which the market's packed update indexed out of its replay
    (`PACK_COMBO_OPTIONS`); under `run.pack_split_k` with the plan's split-K pass. Inductor is not run: the options
    it is given are read."""
    given: list[dict[str, Any]] = []

    def spy(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        given.append(options)
        return fn

    monkeypatch.setattr(torch, "compile", spy)
    configs = [run_config(i, full=False) for i in range(2)]
    asked = {"combo_kernels": combo, "pack_split_k": split_k}
    configs = [c.model_copy(update={"run": c.run.model_copy(update=asked)}) for c in configs]
    plan = PackPlan(Pack(configs, solo_run), compiled=True)
    plan.run(0)
    expected: dict[str, Any] = {"combo_kernels": True, "benchmark_combo_kernel": False} if combo else {}
    if split_k:
        expected["post_grad_custom_post_pass"] = plan.split_k
    assert given == [{"dynamic": False, "options": expected}]


@pytest.mark.slow
def test_a_compiled_pack_with_its_long_products_split_is_the_eager_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run.pack_split_k` through Inductor (thresholds lowered to the small runs' rows): the batched weight
    gradients over many rows a run are rewritten (`trainer.execution.split_k`), and the eager pack's losses and
    state after 2 updates hold. Inductor's caches are off: a compilation they answer runs no pass."""
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    configs = [run_config(i, full=False) for i in range(2)]
    configs = [c.model_copy(update={"run": c.run.model_copy(update={"pack_split_k": True})}) for c in configs]
    eager, compiled = PackPlan(Pack(configs, solo_run)), PackPlan(Pack(configs, solo_run), compiled=True)
    compiled.split_k = SplitLongRows(min_rows=64, chunk_rows=16, max_outputs=128 * 128)
    assert_runs_alike(eager, compiled, updates=2)
    assert compiled.split_k.rewritten and all(rows >= 64 for _, _, rows, _ in compiled.split_k.rewritten)


@contextlib.contextmanager
def no_vmap_fallback() -> Iterator[None]:
    """vmap raises where an op has no batching rule, instead of looping over the runs (one kernel per run)."""
    functorch: Any = torch._C._functorch  # private switches, not in torch's stubs
    enabled = functorch._is_vmap_fallback_enabled()
    functorch._set_vmap_fallback_enabled(False)
    try:
        yield
    finally:
        functorch._set_vmap_fallback_enabled(enabled)


@pytest.mark.parametrize("full", [False, True], ids=["core", "full"])
def test_no_op_of_a_pack_step_takes_vmaps_fallback(full: bool) -> None:
    """Every op of a pack step (sampling, `train_step` with the attention model, the write-back) is batched over
    the runs: attention, which has no batching rule on the CPU (nor for its CUDA backward), runs as the pack's
    `pack_attention`."""
    pack = Pack([run_config(i, full) for i in range(2)], solo_run)
    plan = PackPlan(pack)
    with no_vmap_fallback():
        for step in range(3):
            output = plan.run(step)
    assert output.ok.tolist() == [True, True]


def aten_ops(call: Callable[[], object]) -> int:
    """aten ops one call of `call` dispatches (CPU profiler), after one call to warm up."""
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


def test_a_pack_steps_ops_do_not_grow_with_its_runs() -> None:
    """A pack update of K = 6 runs dispatches about as many ops as one of K = 3 (`full`: every loss and the
    attention model; each of the three configs in both), its per-run draws aside (each run's own generators:
    fixed here). An op looped by vmap's fallback adds at least one op per run (measured: attention's two looped
    ops added 248 at K = 6); what may differ is a CPU product zero-filling its output at one size (2 ops)."""
    counts = {}
    for size in (3, 6):
        configs = [run_config(i % 3, full=True) for i in range(size)]
        for i, config in enumerate(configs):
            config.run.seed = i
        plan = PackPlan(Pack(configs, solo_run))
        drawn = plan.draw()
        plan.draw = functools.partial(tuple.__getitem__, (drawn,), 0)  # type: ignore[method-assign]
        counts[size] = aten_ops(functools.partial(plan.run, 1))
    assert counts[6] - counts[3] < 6 - 3, counts


def test_a_run_that_diverges_is_skipped_alone() -> None:
    """A run whose replay holds a NaN reward: its guard skips every update, the other runs are their solo runs."""
    configs = [run_config(i, full=False) for i in range(3)]
    solos = [Solo(i, config) for i, config in enumerate(configs)]
    pack = Pack(configs, solo_run)
    pack.replays[1].storage.reward.fill_(float("nan"))
    online = pack.states[1].online.clone()
    plan = PackPlan(pack)
    for step in range(2):
        for i in (0, 2):
            solos[i].step(step)
        output = plan.run(step)
    assert output.ok.tolist() == [True, False, True]
    assert [int(s.guard_skips) for s in pack.states] == [0, 2, 0]
    assert torch.equal(pack.states[1].online, online)
    errors = [(i, n, e) for i, n, e in relative_errors(pack, solos) if i != 1 and e > RTOL.get(n, 0.0)]
    assert not errors


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("rng", ["torch", "keyed"])
def test_a_packed_graph_starts_as_its_solo_runs_and_its_drift_over_2000_updates(rng: str) -> None:
    """The `core` model at B = 256 (replay 20,000), K = 4 runs differing in seed, lr and γ, captured as the graph
    plan captures (10 updates per replay, float32) against each run's solo graph plan (= eager, bit for bit), with
    torch's generators and keyed ones (which a capture must not register with torch: it refuses them, as the
    market's keyed pack found on an H100, 2026-12-07).

    On the GPU a batched product is another cuBLAS kernel than one run's, so the pack is not bit-identical: after
    the first replay `state.online` differed by at most 6.1e-8 and the priorities by 9.4e-9 (H100, 2026-12-06,
    `scripts/profile_pack.py`). Those differences then change which slots PER draws, after about 40 updates,
    and the trajectories part as the TF32 plan's part from eager (docs/benchmarks/README.md): the test holds
    the first replay to `FIRST_REPLAY_RTOL` and prints each tensor's drift after 2,000 updates."""
    from trainer.tools.bench import BenchOptions, preset_config, solo_runs_beside_pack

    options = BenchOptions(batch_size=256, capacity=20_000, overrides=[f"run.rng={rng}"])
    base = preset_config("core", options).model_copy()
    configs = [
        base.model_copy(
            update={
                "run": base.run.model_copy(update={"seed": i, "device": "cuda"}),
                "optim": base.optim.model_copy(update={"lr": (1e-4, 3e-4, 1e-3, 5e-5)[i]}),
                "loss": base.loss.model_copy(update={"gamma": (0.99, 0.97, 0.95, 0.9)[i]}),
            }
        )
        for i in range(4)
    ]
    solos, packed = solo_runs_beside_pack(configs, functools.partial(random_run, transitions=options.capacity))
    pack = packed.pack

    def errors() -> dict[str, float]:
        worst: dict[str, float] = {}
        for i, (run, _) in enumerate(solos):
            mine = run_tensors(pack.states[i], pack.replays[i])
            for name, want in run_tensors(run.state, run.replay).items():
                diff = (mine[name].double() - want.double()).norm() / want.double().norm().clamp(min=1e-30)
                worst[name] = max(worst.get(name, 0.0), float(diff))
        return worst

    updates = 2000
    for step in range(0, updates, packed.steps_per_call):
        packed.run(step)
        for _, plan in solos:
            plan.run(step)
        if step == 0:
            first = errors()
    drift = errors()
    print(f"\npacked graph (K=4, fp32, {rng} draws) against solo graph plans, largest relative error per tensor:")
    print(f"  {'tensor':<28} {'10 updates':>10} {'2000 updates':>12}")
    for name in sorted(drift):
        print(f"  {name:<28} {first[name]:>10.2e} {drift[name]:>12.2e}")
    assert all(float(s.updates) == updates for s in pack.states)
    assert first["state.online"] < FIRST_REPLAY_RTOL and first["replay.sampler.tree"] < FIRST_REPLAY_RTOL, first


def cuda_kernels(call: Callable[[], object]) -> int:
    """CUDA kernels (and memory operations) one call of `call` launches, by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("rng", ["torch", "keyed"])
def test_a_pack_step_launches_one_runs_kernels_and_its_draws(rng: str) -> None:
    """vmap batches every product over the runs' stacked weights: K runs launch one run's kernels, plus the two
    draws each run makes from its own generators (PER's points and the step's uniforms), or under `run.rng: keyed`
    one launch of each draw for all runs. No op takes vmap's fallback (attention's backward did, looping over the
    runs, before `pack_attention`): measured on an H100 before it, 916 kernels at K = 1 and 944 at 8."""
    from trainer.tools.bench import BenchOptions, preset_config

    options = BenchOptions(batch_size=256, capacity=20_000, overrides=[f"run.rng={rng}"])
    base = preset_config("core", options)
    counts = {}
    for size in (1, 8):
        configs = [
            base.model_copy(update={"run": base.run.model_copy(update={"seed": i, "device": "cuda"})})
            for i in range(size)
        ]

        plan = PackPlan(Pack(configs, functools.partial(random_run, transitions=2_000)))
        with no_vmap_fallback():
            counts[size] = cuda_kernels(functools.partial(plan.run, 0))
    print(f"\nkernels per eager pack step ({rng}): K=1 {counts[1]}, K=8 {counts[8]}")
    assert counts[8] <= counts[1] + (2 * 7 if rng == "torch" else 0) + 8, counts


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_compiled_packed_graph_is_the_packed_graph(precision: str) -> None:
    """The packed fused plan (the vmapped update through Inductor, captured: `PackPlan.for_plan(pack, "fused")`)
    against the packed graph plan in float32, K = 4 runs of `core` at B = 256, after one replay (10 updates; later
    the priorities' rounding changes which slots PER draws and the runs part, as a solo fused plan's do): within
    the solo fused plan's tolerances against eager (float32: the plans' `COMPILED_RTOL`; bf16: `BF16_RTOL`, over a
    uniform replay: with PER, bf16's priorities drew other slots within the first replay, H100 2026-12-06)."""
    from tests.trainer.execution.plans.test_equivalence import COMPILED_RTOL as PLAN_COMPILED_RTOL
    from trainer.execution.plans.fused import BF16_RTOL
    from trainer.tools.bench import BenchOptions, preset_config

    options = BenchOptions(batch_size=256, capacity=20_000)
    base = preset_config("core", options)
    make = functools.partial(random_run, transitions=options.capacity)
    # bf16: uniform replay (α = 0), or the priorities' bf16 rounding changes which slots the runs draw at once
    replay = base.replay.model_copy(update={"alpha": 0.0 if precision == "bf16" else base.replay.alpha})

    def pack_of(precision: str) -> Pack:
        run = base.run.model_copy(update={"device": "cuda", "precision": precision})
        runs = [run.model_copy(update={"seed": i}) for i in range(4)]
        return Pack([base.model_copy(update={"run": r, "replay": replay}) for r in runs], make)

    graph, fused = PackPlan.for_plan(pack_of("fp32"), "graph"), PackPlan.for_plan(pack_of(precision), "fused")
    assert fused.name == "pack-fused" and fused.steps_per_call == graph.steps_per_call
    graph.run(0)
    fused.run(0)
    want = graph.pack.tensors()
    errors = {
        name: float((tensor.double() - want[name].double()).norm() / want[name].double().norm().clamp(1e-30))
        for name, tensor in fused.pack.tensors().items()
    }
    limit = BF16_RTOL if precision == "bf16" else PLAN_COMPILED_RTOL
    print(f"\npacked fused ({precision}) against packed graph (fp32), K=4, 10 updates: {errors}")
    assert {name: e for name, e in errors.items() if not e <= limit} == {}
