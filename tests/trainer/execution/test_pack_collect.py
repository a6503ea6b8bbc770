"""A pack's batched collection (`trainer.execution.pack_collect`): every run collects what its solo run collects
(the same rows, priorities, writer bookkeeping, episode returns and generator states, bit for bit on the CPU),
and a run left out (a frozen one) collects nothing."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch

from contracts.config import TrainConfig, load_config
from contracts.packs import PackError
from tests.factories import SMALL_CARTPOLE, WarmedCapture, on_cuda_exploring
from trainer.execution.data.gym_source import GymSource
from trainer.execution.data.process_env import ProcessVectorEnv
from trainer.execution.pack import Pack, PackRun
from trainer.execution.pack_collect import PackCollector
from trainer.execution.pack_envs import GymPackEnvs
from trainer.runtime.timing import StepTimer
from trainer.runtime.train import Run, build_run, collect, fill_replay

CARTPOLE = Path(__file__).resolve().parents[3] / "examples" / "cartpole.yaml"
EPSILONS = ((0.3, 0.05), (0.5, 0.02), (0.2, 0.1))
"""Each run's ε schedule (start, end): greedy and random actions both, and a different ε per run."""


def run_configs(capacity: int = 300, streams: int = 1) -> list[TrainConfig]:
    """Three runs of a small CartPole (`streams` envs each): their own seed and ε; a small ring, so 400 steps wrap
    it."""
    return [
        load_config(
            CARTPOLE,
            [
                *SMALL_CARTPOLE,
                f"run.seed={seed}",
                f"data.epsilon_start={start}",
                f"data.epsilon_end={end}",
                "data.epsilon_decay_steps=200",
                f"replay.capacity={capacity}",
                f"data.num_envs={streams}",
            ],
        )
        for seed, (start, end) in zip((1, 2, 3), EPSILONS, strict=True)
    ]


def built(configs: list[TrainConfig], tmp_path: Path, tag: str) -> list[Run]:
    runs = [build_run(config, tmp_path / f"{tag}-{i}") for i, config in enumerate(configs)]
    for run in runs:
        fill_replay(run)
    return runs


def packed(configs: list[TrainConfig], runs: list[Run]) -> tuple[Pack, PackCollector]:
    pack = Pack.of(configs, [PackRun(run.state, run.replay, run.generator) for run in runs])
    collector = PackCollector(pack, [run.source for run in runs], [run.explore_generator for run in runs])
    return pack, collector


def perturb(runs: list[Run]) -> None:
    """Different networks per run (a trained pack's runs differ), so each run's greedy actions are its own."""
    for i, run in enumerate(runs):
        with torch.no_grad():
            run.state.online.add_(torch.randn(run.state.online.shape, generator=torch.Generator().manual_seed(i)))


def assert_collected_alike(solo: Run, mine: Run) -> None:
    want, got = solo.replay.state_dict(), mine.replay.state_dict()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert len(mine.replay) == len(solo.replay)
    assert solo.online_source.finished_returns == mine.online_source.finished_returns
    assert torch.equal(solo.explore_generator.get_state(), mine.explore_generator.get_state())


@pytest.mark.parametrize(("whole_levels", "streams"), [(False, 1), (True, 2)], ids=["paths-1env", "levels-2envs"])
def test_batched_collection_stores_each_runs_solo_transitions(tmp_path: Path, whole_levels: bool, streams: int) -> None:
    """400 env steps (episodes end, the 300-row ring wraps) with ε from each run's schedule: each run's replay,
    returns and explore generator equal those of its solo run collecting through `trainer.runtime.train.collect`.
    Both ways of summing the new priorities (changed paths: the CPU's; whole levels: a GPU's) are checked, and
    the runs' envs stepped as one vector env, each run's share of it one or two envs."""
    configs = run_configs(streams=streams)
    solos, runs = built(configs, tmp_path, "solo"), built(configs, tmp_path, "pack")
    perturb(solos)
    perturb(runs)
    _, collector = packed(configs, runs)
    collector.whole_levels = whole_levels
    assert isinstance(collector.envs, GymPackEnvs) and collector.envs.joint is not None
    assert collector.envs.joint.num_envs == 3 * streams
    for step in range(0, 400, 50):
        for solo in solos:
            solo.step = step
            collect(solo, solo.act_fn(), 50)
        collector.collect([0, 1, 2], step, 50, runs[0].timer)
    stored = runs[0].replay.storage.action[: len(runs[0].replay)]
    assert stored.unique().numel() == 2  # both CartPole actions were taken
    for solo, mine in zip(solos, runs, strict=True):
        assert_collected_alike(solo, mine)
        assert mine.replay.storage.obs.data_ptr() != solo.replay.storage.obs.data_ptr()


def test_runs_whose_envs_step_in_a_worker_each_collect_their_solo_rows(tmp_path: Path) -> None:
    """`data.vector_env: process`: every run's envs in a worker process of its own, all of them stepping at once
    (each run's actions sent before any step is gathered); each run collects what its solo run collects in its own
    process (`sync`)."""
    configs = run_configs(streams=2)
    solos = built(configs, tmp_path, "solo")
    runs = built(
        [c.model_copy(update={"data": c.data.model_copy(update={"vector_env": "process"})}) for c in configs],
        tmp_path,
        "pack",
    )
    perturb(solos)
    perturb(runs)
    _, collector = packed(configs, runs)
    assert isinstance(collector.envs, GymPackEnvs) and collector.envs.joint is None
    assert all(isinstance(run.online_source.envs, ProcessVectorEnv) for run in runs)
    for step in range(0, 200, 50):
        for solo in solos:
            solo.step = step
            collect(solo, solo.act_fn(), 50)
        collector.collect([0, 1, 2], step, 50, runs[0].timer)
    for solo, mine in zip(solos, runs, strict=True):
        assert_collected_alike(solo, mine)
        mine.source.close()


def test_a_captured_step_collects_as_the_uncaptured_one(tmp_path: Path) -> None:
    """Each step's choice of actions and its store replayed as captured (each body warmed up on the step's own
    values, then run again): the warm-up's draws are put back and its rows written over, so every run still
    collects its solo rows; two captures in all, reused by every later step."""
    configs = run_configs()
    solos, runs = built(configs, tmp_path, "solo"), built(configs, tmp_path, "pack")
    perturb(solos)
    perturb(runs)
    _, collector = packed(configs, runs)
    collector.capture = capture = WarmedCapture()
    for step in range(0, 400, 50):
        for solo in solos:
            solo.step = step
            collect(solo, solo.act_fn(), 50)
        collector.collect([0, 1, 2], step, 50, runs[0].timer)
    assert capture.captured == 2
    for solo, mine in zip(solos, runs, strict=True):
        assert_collected_alike(solo, mine)


@pytest.mark.gpu
def test_on_a_gpu_random_collection_stores_each_runs_solo_transitions(tmp_path: Path) -> None:
    """On cuda (each step's choice of actions and its store CUDA graphs, whole levels of all trees a kernel, the
    batched writes, the runs' generators on the device), with every action random (ε = 1: a batched forward's
    rounding cannot flip a greedy pick) each run's replay, returns and explore generator equal its solo run's, bit
    for bit."""
    configs = on_cuda_exploring(run_configs())
    solos, runs = built(configs, tmp_path, "solo"), built(configs, tmp_path, "pack")
    _, collector = packed(configs, runs)
    assert collector.whole_levels
    for step in range(0, 400, 50):
        for solo in solos:
            solo.step = step
            collect(solo, solo.act_fn(), 50)
        collector.collect([0, 1, 2], step, 50, runs[0].timer)
    assert len(collector.graphs) == 2  # each step's choice and store replayed as CUDA graphs
    for solo, mine in zip(solos, runs, strict=True):
        assert_collected_alike(solo, mine)


@pytest.mark.parametrize("live", [[0, 2], [1]], ids=["two-live", "one-live"])
def test_a_run_left_out_collects_nothing(tmp_path: Path, live: list[int]) -> None:
    """The runs left out (frozen) keep their replay, envs and generator as they were; the live ones collect their
    solo rows (one live run acts through its own forward, not vmap's)."""
    configs = run_configs()
    runs = built(configs, tmp_path, "pack")
    solos = built(configs, tmp_path, "solo")
    perturb(runs)
    perturb(solos)
    _, collector = packed(configs, runs)
    out = [i for i in range(3) if i not in live]
    before = {i: {name: t.clone() for name, t in runs[i].replay.state_dict().items()} for i in out}
    observation = {i: runs[i].online_source.observation.copy() for i in out}
    generator = {i: runs[i].explore_generator.get_state() for i in out}
    collector.collect(live, 0, 30, StepTimer("cpu"))
    for i in out:
        for name, tensor in runs[i].replay.state_dict().items():
            assert torch.equal(tensor, before[i][name]), name
        assert (runs[i].online_source.observation == observation[i]).all()
        assert torch.equal(runs[i].explore_generator.get_state(), generator[i])
    for i in live:
        solos[i].step = 0
        collect(solos[i], solos[i].act_fn(), 30)
        assert_collected_alike(solos[i], runs[i])
    collector.collect([0, 1, 2], 30, 30, StepTimer("cpu"))  # then all of them, their envs as one vector env
    for i, solo in enumerate(solos):
        solo.step = 30
        collect(solo, solo.act_fn(), 30)
        assert_collected_alike(solo, runs[i])


def test_a_pack_without_gymnasium_sources_is_refused(tmp_path: Path) -> None:
    configs = run_configs()[:2]
    runs = built(configs, tmp_path, "pack")
    pack = Pack.of(configs, [PackRun(run.state, run.replay, run.generator) for run in runs])
    assert all(isinstance(run.source, GymSource) for run in runs)
    with pytest.raises(PackError, match="Gymnasium sources"):
        PackCollector(pack, [runs[0].source, object()], [run.explore_generator for run in runs])
    with pytest.raises(PackError, match="one source and generator per run"):
        PackCollector(pack, [runs[0].source], [run.explore_generator for run in runs])


@pytest.mark.parametrize("vector", ["sync", "process"])
def test_the_runs_evaluation_episodes_played_at_once_score_as_each_runs_own(tmp_path: Path, vector: str) -> None:
    """Runs 0 and 2 (run 1 left out), 6 greedy episodes each from their own seeds, played side by side with one
    batched forward a step (`process`: each run's in a worker process of its own, all at once): each run's returns
    are those `GymSource.evaluate` gives it alone, in order."""
    configs = [c.model_copy(update={"data": c.data.model_copy(update={"vector_env": vector})}) for c in run_configs()]
    before = set(multiprocessing.active_children())  # another test's, in this process
    runs = built(configs, tmp_path, "pack")
    perturb(runs)
    _, collector = packed(configs, runs)
    played = collector.evaluate([0, 2], 6, [100, 300])
    for row, i in enumerate((0, 2)):
        want = runs[i].source.evaluate(runs[i].act_fn(), 6, (100, 300)[row])
        assert played[row] == want
    assert len({value for row in played for value in row}) > 2  # episodes of several lengths
    assert collector.evaluate([0, 1], 0, [1, 2]) == [[], []]
    for run in runs:
        run.source.close()
    assert set(multiprocessing.active_children()) <= before  # the evaluations' workers ended with them
