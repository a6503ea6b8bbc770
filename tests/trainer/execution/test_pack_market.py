"""The torch market's envs of a pack's runs as one batch (`trainer.execution.pack_market`): every run's markets
step, draw and collect as they do alone (bit for bit on the CPU), HER's goal columns included, and a run left
out stores nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contracts.config import TrainConfig, load_config
from contracts.packs import PackError
from tests.factories import SMALL_MARKET, WarmedCapture, on_cuda_exploring
from trainer.algo.rng import KeyedGenerator, KeyedRows
from trainer.execution.data.market_torch import TorchMarket, TorchMarketSource
from trainer.execution.pack import Pack, PackRun
from trainer.execution.pack_collect import PackCollector
from trainer.execution.pack_market import MarketPackEnvs, StackedMarkets
from trainer.runtime.timing import StepTimer
from trainer.runtime.train import Run, build_run, collect, fill_replay

MARKET = Path(__file__).resolve().parents[3] / "examples" / "market.yaml"


def run_configs(*more: str) -> list[TrainConfig]:
    """Three small market runs (torch market on the CPU, HER on, episodes of 16 steps of 4 envs, a 300-row ring):
    their own seed and ε."""
    schedules = ((0.3, 0.05), (0.6, 0.02), (0.2, 0.1))
    return [
        load_config(
            MARKET, [*SMALL_MARKET, *more, f"run.seed={seed}", f"data.epsilon_start={eps}", f"data.epsilon_end={end}"]
        )
        for seed, (eps, end) in zip((1, 2, 3), schedules, strict=True)
    ]


def built(configs: list[TrainConfig], tmp_path: Path, tag: str) -> list[Run]:
    runs = [build_run(config, tmp_path / f"{tag}-{i}") for i, config in enumerate(configs)]
    for i, run in enumerate(runs):
        assert isinstance(run.source, TorchMarketSource)
        fill_replay(run)
        with torch.no_grad():  # different networks per run, so each run's greedy actions are its own
            noise = torch.randn(run.state.online.shape, generator=torch.Generator().manual_seed(i))
            run.state.online.add_(noise.to(run.state.online.device))
    return runs


def packed(configs: list[TrainConfig], runs: list[Run]) -> PackCollector:
    pack = Pack.of(configs, [PackRun(run.state, run.replay, run.generator) for run in runs])
    return PackCollector(pack, [run.source for run in runs], [run.explore_generator for run in runs])


def assert_collected_alike(solo: Run, mine: Run) -> None:
    want, got = solo.replay.state_dict(), mine.replay.state_dict()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert solo.online_source.finished_returns == mine.online_source.finished_returns
    assert torch.equal(solo.explore_generator.get_state(), mine.explore_generator.get_state())
    theirs, ours = solo.online_source, mine.online_source
    assert isinstance(theirs, TorchMarketSource) and isinstance(ours, TorchMarketSource)
    assert torch.equal(theirs.market.generator.get_state(), ours.market.generator.get_state())
    assert torch.equal(theirs.market.state.obs, ours.market.state.obs)


def test_markets_stacked_step_as_each_steps_alone() -> None:
    """Three markets of 5 envs as one of 15, over two episodes (resets included): every step's rewards and next
    observations, the final state and each market's generator equal the markets stepped one by one."""
    alone = [TorchMarket(5, seed, "cpu") for seed in (4, 5, 6)]
    stacked_markets = [TorchMarket(5, seed, "cpu") for seed in (4, 5, 6)]
    stacked = StackedMarkets(stacked_markets)
    actions = torch.Generator().manual_seed(0)
    horizon = alone[0].params.horizon
    for t in range(2 * horizon):
        action = torch.randint(0, 5, (15, 3), generator=actions)
        ended = t + 1 == horizon or t + 1 == 2 * horizon
        out = stacked.step(action, ended)
        for i, market in enumerate(alone):
            want = market.step(action[5 * i : 5 * (i + 1)], ended)
            assert torch.equal(out.reward[5 * i : 5 * (i + 1)], want.reward)
            assert torch.equal(out.next_obs[5 * i : 5 * (i + 1)], want.next_obs)
    for market, mine in zip(alone, stacked_markets, strict=True):
        assert torch.equal(market.state.obs, mine.state.obs)  # run i's market reads its rows of the stack
        assert torch.equal(market.state.alpha, mine.state.alpha)
        assert torch.equal(market.generator.get_state(), mine.generator.get_state())


def collect_alike(
    configs: list[TrainConfig], tmp_path: Path, chunk: int, capture: WarmedCapture | None = None
) -> list[Run]:
    """60 updates of 4 envs, `chunk` updates a call (episodes of 16 steps end; the 300-row ring wraps) with each
    run's ε schedule, packed and solo; asserts each run collected what its solo run did."""
    solos, runs = built(configs, tmp_path, "solo"), built(configs, tmp_path, "pack")
    collector = packed(configs, runs)
    assert isinstance(collector.envs, MarketPackEnvs)
    if capture is not None:
        collector.capture = capture
    for step in range(0, 60, chunk):
        for solo in solos:
            solo.step = step
            collect(solo, solo.act_fn(), chunk)
        collector.collect([0, 1, 2], step, chunk, StepTimer("cpu"))
    assert runs[0].replay.storage.achieved_goal.abs().sum() > 0  # goal columns were written
    assert len(runs[0].online_source.finished_returns) >= 4 * 3  # episodes ended
    for solo, mine in zip(solos, runs, strict=True):
        assert_collected_alike(solo, mine)
    return runs


@pytest.mark.parametrize("chunk", [4, 5, 20], ids=["blocks-ending-together", "blocks-ending-anywhere", "step-by-step"])
def test_batched_market_collection_stores_each_runs_solo_transitions(tmp_path: Path, chunk: int) -> None:
    """Each run's replay (HER's achieved goals and base rewards included), finished returns, generators and market
    equal its solo run's collecting through `trainer.runtime.train.collect`: in blocks whose host values are
    planned up front (4 or 5 updates a call; an episode ends at a block's last step, or anywhere in it), or step
    by step (20 a call: longer than an episode)."""
    collect_alike(run_configs(), tmp_path, chunk)


def test_a_block_back_fills_only_the_episode_rows_it_did_not_write_over(tmp_path: Path) -> None:
    """A 40-row ring, smaller than an episode (64 rows): rows written after an episode's end in the same block
    take some of its slots; back-filled after the block, those keep their own bookkeeping, as in the solo run."""
    runs = collect_alike(run_configs("replay.capacity=40"), tmp_path, 5)
    assert (runs[0].replay.storage.episode_len == 16).any()


def test_a_captured_block_collects_as_the_uncaptured_one(tmp_path: Path) -> None:
    """Blocks replayed as captured (the body warmed up on the block's own plan, then run again): the warm-up's
    rows are written over and its market steps and draws put back, so every run still collects its solo rows.
    One capture per pattern of episode ends (5-step blocks from step 8 of 16-step episodes: 5 patterns in 12 blocks)."""
    capture = WarmedCapture()
    collect_alike(run_configs(), tmp_path, 5, capture)
    assert capture.captured == 5


@pytest.mark.parametrize("captured", [False, True])
def test_keyed_runs_collect_their_solo_rows_drawing_as_one(tmp_path: Path, captured: bool) -> None:
    """`run.rng: keyed`: the markets' noise and ε-greedy's draws of every run in one call each (`KeyedRows`), and
    each run still collects its solo rows, captured too (the warm-up's draws put back through the counters)."""
    runs = collect_alike(run_configs("run.rng=keyed"), tmp_path, 5, WarmedCapture() if captured else None)
    explore = [run.explore_generator for run in runs]
    markets = [run.online_source.market.generator for run in runs if isinstance(run.online_source, TorchMarketSource)]
    assert all(isinstance(g, KeyedGenerator) for g in [*explore, *markets]) and len(markets) == 3
    for generators in (explore, markets):  # the collection drew them as rows of one pack (solo states: compared above)
        rows = generators[0].rows
        assert isinstance(rows, KeyedRows) and rows.generators == generators and rows.counters.min() > 0


def test_a_market_run_left_out_stores_nothing(tmp_path: Path) -> None:
    """Run 1 frozen: its replay and explore generator stay as they were (its market steps on, with actions 0,
    beside the others); runs 0 and 2 store their solo rows."""
    configs = run_configs()
    solos, runs = built(configs, tmp_path, "solo"), built(configs, tmp_path, "pack")
    collector = packed(configs, runs)
    before = {name: t.clone() for name, t in runs[1].replay.state_dict().items()}
    generator = runs[1].explore_generator.get_state()
    collector.collect([0, 2], 0, 20, StepTimer("cpu"))
    for name, tensor in runs[1].replay.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert torch.equal(runs[1].explore_generator.get_state(), generator)
    for i in (0, 2):
        solos[i].step = 0
        collect(solos[i], solos[i].act_fn(), 20)
        assert_collected_alike(solos[i], runs[i])


@pytest.mark.parametrize("rng", ["torch", "keyed"])
def test_the_market_runs_evaluations_played_at_once_score_as_each_runs_own(tmp_path: Path, rng: str) -> None:
    configs = run_configs(f"run.rng={rng}")
    runs = built(configs, tmp_path, "pack")
    collector = packed(configs, runs)
    played = collector.evaluate([0, 2], 3, [100, 300])
    for row, i in enumerate((0, 2)):
        assert played[row] == runs[i].source.evaluate(runs[i].act_fn(), 3, (100, 300)[row])
    assert len({value for row in played for value in row}) == 6


def test_markets_at_different_episode_steps_are_refused(tmp_path: Path) -> None:
    configs = run_configs()[:2]
    runs = built(configs, tmp_path, "pack")
    source = runs[1].online_source
    assert isinstance(source, TorchMarketSource)
    source.collect(None, 1.0, runs[1].explore_generator)
    with pytest.raises(PackError, match="same episode step"):
        packed(configs, runs)


@pytest.mark.gpu
def test_on_a_gpu_captured_market_blocks_store_each_runs_solo_transitions(tmp_path: Path) -> None:
    """On cuda, blocks of 5 updates replayed as CUDA graphs (one per pattern of episode ends), every action random
    (ε = 1: a batched forward's rounding cannot flip a greedy pick), 60 updates: each run's stored integers
    (actions, bookkeeping), generators and markets' draws equal its solo run's, bit for bit; its float columns
    too, or within 1e-6 where a stacked kernel sums an env's 3 assets in another order."""
    configs = on_cuda_exploring(run_configs())
    solos, runs = built(configs, tmp_path, "solo"), built(configs, tmp_path, "pack")
    collector = packed(configs, runs)
    assert collector.capture is not None
    for step in range(0, 60, 5):
        for solo in solos:
            solo.step = step
            collect(solo, solo.act_fn(), 5)
        collector.collect([0, 1, 2], step, 5, StepTimer("cuda"))
    torch.cuda.synchronize()
    assert len(collector.graphs) == 5
    for solo, mine in zip(solos, runs, strict=True):
        want, got = solo.replay.state_dict(), mine.replay.state_dict()
        for name, tensor in want.items():
            if tensor.is_floating_point():
                torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=1e-6, msg=name)
            else:
                assert torch.equal(got[name], tensor), name
        assert torch.equal(solo.explore_generator.get_state(), mine.explore_generator.get_state())
        theirs, ours = solo.online_source, mine.online_source
        assert isinstance(theirs, TorchMarketSource) and isinstance(ours, TorchMarketSource)
        assert theirs.finished_returns == pytest.approx(ours.finished_returns, rel=1e-6, abs=1e-6)
        assert torch.equal(theirs.market.generator.get_state(), ours.market.generator.get_state())
        torch.testing.assert_close(ours.market.state.obs, theirs.market.state.obs, rtol=1e-6, atol=1e-6)
