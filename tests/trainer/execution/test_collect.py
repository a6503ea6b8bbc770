"""The torch market's collection graph (trainer/execution/collect.py) on the CPU: its device epsilon, its patterns of
episode ends, and training in lockstep with the loop's own collection, uncaptured and through a CPU
stand-in for a CUDA graph that replays the captured body's device work and none of its host code."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from contracts.config import TrainConfig
from tests.factories import needs_gpu, tiny_config
from tests.trainer.runtime.test_train import KStepPlan
from tests.trainer.runtime.test_train_equivalence import advance, differing
from trainer.algo.replay.writer import DeviceRingWriter, RingWriter
from trainer.execution.collect import MarketCollector, Phase, Replayable, Saved, collect_graph_applies, device_epsilon
from trainer.execution.data.gym_source import epsilon_greedy, linear_epsilon
from trainer.execution.data.market_torch import TorchMarketSource
from trainer.execution.plans.eager import EagerPlan
from trainer.runtime import train
from trainer.runtime.train import Run, build_run, fill_replay, start_plan


@pytest.mark.parametrize(("start", "end", "decay"), [(1.0, 0.05, 10_000), (0.9, 0.1, 7), (1.0, 0.02, 3), (0.3, 0.3, 1)])
def test_device_epsilon_is_linear_epsilon_bit_for_bit(start: float, end: float, decay: int) -> None:
    steps = torch.arange(-2, 3 * decay + 40)
    decay_t = torch.tensor(float(decay), dtype=torch.float64)
    device = [float(device_epsilon(step, start, end, decay_t)) for step in steps]
    host = [linear_epsilon(int(step), start, end, decay) for step in steps]
    assert device == host


def test_epsilon_greedy_compares_a_device_epsilon_as_it_compares_a_float() -> None:
    """The draw u < epsilon runs in float32 either way (epsilon rounded to float32 first), also at an
    epsilon whose float32 rounds down (0.7), where a float64 comparison would differ."""
    for epsilon in (0.7, 0.1, 0.05, 1.0 / 3.0, 0.0, 1.0):
        u = torch.tensor([epsilon], dtype=torch.float32)
        neighbours = torch.cat([u, torch.nextafter(u, torch.ones(1)), torch.nextafter(u, torch.zeros(1))])
        assert torch.equal(neighbours < epsilon, neighbours < torch.tensor(epsilon, dtype=torch.float64))
        greedy = torch.randint(0, 5, (64, 3), generator=torch.Generator().manual_seed(1))
        as_float = epsilon_greedy(greedy, epsilon, 5, torch.Generator().manual_seed(2))
        as_tensor = epsilon_greedy(
            greedy, torch.tensor(epsilon, dtype=torch.float64), 5, torch.Generator().manual_seed(2)
        )
        assert torch.equal(as_float, as_tensor)


class PhaseSource:
    """Just what `MarketCollector.phases` reads of a source."""

    def __init__(self, t: int) -> None:
        self.episode_step = t


@pytest.mark.parametrize(("horizon", "steps"), [(16, 6), (200, 10), (8, 8), (9, 4), (12, 1), (10, 7)])
def test_phases_are_one_per_pattern_that_blocks_meet(horizon: int, steps: int) -> None:
    for t0 in range(horizon):
        collector = MarketCollector.__new__(MarketCollector)
        collector.source = PhaseSource(t0)  # type: ignore[assignment]
        collector.horizon, collector.env_steps = horizon, 1
        met: dict[tuple[bool, ...], None] = {}
        t = t0
        for _ in range(horizon):  # every block start the run goes through
            met[Phase(t, steps).ends(horizon)] = None
            t = (t + steps) % horizon
        phases = collector.phases(steps)
        assert sorted(phase.ends(horizon) for phase in phases) == sorted(met)
        assert all(sum(phase.ends(horizon)) <= 1 for phase in phases)
        assert len(phases) <= steps // math.gcd(steps, horizon) + 1


def market_config(*overrides: str, **sections: dict[str, Any]) -> TrainConfig:
    """3 torch market envs of 16-step episodes, 2 env steps per update, K = 3 updates per call (6
    collection steps, 18 rows), a ring of 100 rows, epsilon decaying over 40 updates;
    the warm-up (36 rows) leaves the envs at episode step 12, so episode ends fall at every position
    a block can hold them (1, 3, 5) and some blocks hold none."""
    data = {
        "market_backend": "torch",
        "num_envs": 3,
        "learning_starts": 36,
        "env_steps_per_update": 2,
        "epsilon_decay_steps": 40,
        **sections.pop("data", {}),
    }
    run = {"steps_per_replay": 3, "steps": 60, "collect_graph": True, **sections.pop("run", {})}
    return tiny_config(list(overrides), data=data, replay={"capacity": 100}, run=run, **sections)


K = 3


@pytest.fixture
def k_step_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans of K eager updates per call, as a graph plan with run.steps_per_replay = K (on the CPU)."""
    monkeypatch.setattr(train, "make_plan", lambda *args: KStepPlan(EagerPlan(*args[1:]), K))


@pytest.fixture
def collector_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.collect_graph applies to the torch market on the CPU too (uncaptured unless graph_capture says)."""

    def applies(source: object, device: torch.device, steps: int) -> bool:
        return isinstance(source, TorchMarketSource) and steps <= source.params.horizon

    monkeypatch.setattr(train, "collect_graph_applies", applies)


class HostFreeReplay:
    """A CPU stand-in for a CUDA graph: `replay` runs the captured body's device work again and leaves
    the host state its Python code changes (the device writer's row count) as it was, as a graph does."""

    def __init__(self, body: Callable[[], None], writers: list[DeviceRingWriter]) -> None:
        self.body, self.writers = body, writers

    def replay(self) -> None:
        counts = [writer.written for writer in self.writers]
        self.body()
        for writer, count in zip(self.writers, counts, strict=True):
            writer.written = count


class StandInCapture:
    """`CaptureFn` of HostFreeReplay: warms the body up three times and runs it once as the captured call
    (their effects are the collector's to undo), as `trainer.execution.plans._capture.capture` does."""

    def __init__(self) -> None:
        self.writers: list[DeviceRingWriter] = []
        self.captured = 0

    def __call__(self, body: Callable[[], None], generators: Sequence[torch.Generator]) -> Replayable:
        for _ in range(4):
            body()
        self.captured += 1
        return HostFreeReplay(body, self.writers)


def lockstep(
    a: TrainConfig, b: TrainConfig, tmp_path: Path, before_plan: Callable[[Run], None] | None = None
) -> list[Run]:
    """Two runs side by side (as tests/trainer/runtime/test_train_equivalence.py's), compared after every call; also
    the market's own state, which that comparison does not see. Returns the runs."""
    runs = [build_run(config, tmp_path / name) for name, config in (("a", a), ("b", b))]
    for run in runs:
        fill_replay(run)
        if before_plan is not None:
            before_plan(run)
        start_plan(run)
    assert differing(*runs) == []
    while runs[0].step < a.run.steps:
        for run in runs:
            advance(run)
        assert runs[0].step == runs[1].step
        names = differing(*runs)
        pairs = zip(market_state(runs[0]), market_state(runs[1]), strict=True)
        names += [f"market.{i}" for i, (x, y) in enumerate(pairs) if not torch.equal(x, y)]
        assert names == [], f"the runs parted after {runs[0].step} updates in {names}"
    sources = [run.source for run in runs]
    assert [source.finished_returns for source in sources] == [sources[0].finished_returns] * 2
    assert [source.episode_step for source in sources] == [sources[0].episode_step] * 2
    return runs


def market_state(run: Run) -> list[torch.Tensor]:
    assert isinstance(run.source, TorchMarketSource)
    return run.source.device_state()


@pytest.mark.usefixtures("k_step_plans", "collector_on_the_cpu")
def test_the_uncaptured_collector_trains_as_the_loop_s_collection_bit_for_bit(tmp_path: Path) -> None:
    """60 updates (120 collection steps of 3 envs: 8 episode ends, the ring of 100 rows wrapping 3 times
    after the warm-up's 36): the collector with the device writer holds the loop's collection with the
    host writer exactly, at every call."""
    runs = lockstep(market_config("run.collect_graph=false"), market_config(), tmp_path)
    assert isinstance(runs[0].replay.writer, RingWriter) and runs[0].collector is None
    assert isinstance(runs[1].replay.writer, DeviceRingWriter) and runs[1].collector is not None
    assert len(runs[1].source.finished_returns) == 8 * 3


@pytest.mark.usefixtures("k_step_plans", "collector_on_the_cpu")
def test_a_captured_collector_replays_as_the_loop_s_collection_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture path on the CPU: graphs captured up front for each pattern of episode ends (warm-up and
    captured call undone), replayed without their host code, the host's bookkeeping caught up after."""
    stand_in = StandInCapture()
    monkeypatch.setattr(train, "graph_capture", lambda device: stand_in)

    def register(run: Run) -> None:
        if isinstance(run.replay.writer, DeviceRingWriter):
            stand_in.writers.append(run.replay.writer)

    runs = lockstep(market_config("run.collect_graph=false"), market_config(), tmp_path, register)
    collector = runs[1].collector
    assert collector is not None and collector.capture is stand_in
    # blocks of 6 steps from episode step 12 of 16: an end at position 1, 3 or 5, or none
    assert stand_in.captured == 4 and len(collector.graphs) == 4


@pytest.mark.usefixtures("collector_on_the_cpu")
def test_saved_restores_everything_a_collection_body_writes(tmp_path: Path) -> None:
    run = build_run(market_config(), tmp_path)
    fill_replay(run)
    start_plan(run)
    collector = run.collector
    assert collector is not None
    generators = collector.generators()

    def everything() -> list[torch.Tensor]:
        tensors = [*run.replay.state_dict().values(), *collector.source.device_state()]
        return [tensor.clone() for tensor in tensors] + [generator.get_state() for generator in generators]

    before, written = everything(), collector.writer.written
    saved = Saved(collector)
    for phase in collector.phases(K):
        collector.body(phase)
    assert collector.writer.written != written
    saved.restore()
    after = everything()
    assert collector.writer.written == written
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


def test_the_collector_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    run = build_run(market_config(), tmp_path)  # on the CPU the collection graph does not apply
    assert isinstance(run.replay.writer, RingWriter) and not run.collect_in_graph
    source = run.source
    assert isinstance(source, TorchMarketSource)
    data = run.config.data
    with pytest.raises(ValueError, match="bookkeeping on the device"):
        MarketCollector(source, run.replay, run.act_fn(), data, run.explore_generator, None)
    run.replay.writer = DeviceRingWriter(run.replay.storage, run.replay.sampler, data.num_envs)
    collector = MarketCollector(source, run.replay, run.act_fn(), data, run.explore_generator, None)
    with pytest.raises(ValueError, match=r"at most one episode end: 18 steps > horizon 16"):
        collector.phases(9)
    with pytest.raises(ValueError, match=r"runs uncaptured \(capture=None\)"):
        collector.graph_for(Phase(0, 6))


def test_the_collection_graph_applies_to_the_torch_market_on_cuda_only(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    torch_market = build_run(market_config(), tmp_path / "torch").source
    numpy_market = build_run(market_config(data={"market_backend": "numpy"}), tmp_path / "numpy").source
    assert not collect_graph_applies(torch_market, cpu, 6)
    assert not collect_graph_applies(numpy_market, torch.device("cuda"), 6)
    assert not collect_graph_applies(torch_market, torch.device("cuda"), 17)  # two ends in a block
    assert collect_graph_applies(torch_market, torch.device("cuda"), 16) == torch.cuda.is_available()


def test_phase_ends_mark_the_last_step_of_each_episode() -> None:
    assert Phase(12, 6).ends(16) == (False, False, False, True, False, False)
    assert Phase(0, 4).ends(16) == (False,) * 4
    assert np.flatnonzero(Phase(15, 3).ends(16)).tolist() == [0]


MARKET_GPU = Path(__file__).resolve().parents[3] / "examples" / "market-gpu.yaml"


@pytest.mark.gpu
@needs_gpu
def test_a_captured_market_run_matches_the_uncaptured_one_bit_for_bit_at_every_call(tmp_path: Path) -> None:
    """examples/market-gpu.yaml shortened to 600 updates (zerocopy, K = 10, 32 envs; 3 episode ends, the
    ring of 20,000 rows wrapping): collection as two CUDA graphs (no end, an end at the block's last
    step) holds the uncaptured loop (host writer) exactly, every stateful tensor after every call."""
    from contracts.config import load_config
    from trainer.execution.collect import CudaCapture

    overrides = [
        "run.steps=600",
        "run.log_every=600",
        "run.checkpoint_every=600",
        "run.eval_every=0",
        "run.eval_episodes=0",
        "replay.capacity=20000",
    ]
    uncaptured = load_config(MARKET_GPU, [*overrides, "run.collect_graph=false"])
    runs = lockstep(uncaptured, load_config(MARKET_GPU, [*overrides, "run.collect_graph=true"]), tmp_path)
    collector = runs[1].collector
    assert runs[0].collector is None and isinstance(runs[0].replay.writer, RingWriter)
    assert collector is not None and isinstance(collector.capture, CudaCapture) and len(collector.graphs) == 2
    assert runs[1].plan.name == "zerocopy" and runs[1].plan.steps_per_call == 10
    assert len(runs[1].source.finished_returns) == 4 * 32  # the warm-up's episode, then 3 in 600 updates
