"""The torch market: the NumPy env's dynamics given the same draws, auto-reset, the source, the baseline."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
import torch

from contracts.config import build_config
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data import make_source
from trainer.execution.data.gym_source import GymSource
from trainer.execution.data.market import GOAL, LEVELS, POSITIONS, MarketEnv
from trainer.execution.data.market import signal_policy as signal_policy_np
from trainer.execution.data.market_torch import (
    CORE_NOISE,
    MarketDynamics,
    MarketNoise,
    MarketParams,
    MarketState,
    TorchMarket,
    TorchMarketSource,
    baseline_returns,
    extra_parts,
    random_policy,
    signal_policy,
)


class ScriptedRng:
    """Stands in for a MarketEnv's np_random: serves queued standard normals and uniforms.

    normal(loc, s) = loc + s * z, random() = u, choice(a) = a[floor(u * len(a))]: the mapping the
    torch market documents.
    """

    def __init__(self) -> None:
        self.normals: deque[float] = deque()
        self.uniforms: deque[float] = deque()

    def normal(self, loc: float, scale: float, size: int | None = None) -> Any:
        if size is None:
            return loc + scale * self.normals.popleft()
        return loc + scale * np.array([self.normals.popleft() for _ in range(size)])

    def random(self) -> float:
        return self.uniforms.popleft()

    def choice(self, a: Any, size: int | None = None) -> Any:
        a = np.asarray(a)
        picks = [a[int(self.uniforms.popleft() * len(a))] for _ in range(size or 1)]
        return picks[0] if size is None else np.array(picks)


def observe_order(z: np.ndarray, extra: int) -> list[float]:
    """The torch observation noise z [O] in the order MarketEnv._observe draws it (cut parts draw in full)."""
    order = list(z[:CORE_NOISE])
    column = 0
    for _, size, scale in extra_parts(extra):
        if scale > 0:
            order += [float(z[CORE_NOISE + column + j]) if column + j < extra else 0.0 for j in range(size)]
        column += size
    return order


def queue_reset(rng: ScriptedRng, noise: MarketNoise, env: int, extra: int) -> None:
    rng.normals.extend(noise.reset_alpha[env].tolist())
    rng.normals.extend(observe_order(noise.reset_obs[env].numpy(), extra))
    rng.uniforms.append(float(noise.reset_regime[env]))
    rng.uniforms.extend(noise.reset_goal[env].tolist())


def queue_step(rng: ScriptedRng, noise: MarketNoise, env: int, extra: int) -> None:
    rng.normals.extend(noise.ret[env].tolist())
    rng.normals.extend(noise.alpha[env].tolist())
    rng.normals.extend(observe_order(noise.obs[env].numpy(), extra))
    rng.uniforms.append(float(noise.switch[env]))


@pytest.mark.parametrize(
    ("features", "dtype", "tol"),
    [(64, torch.float64, 1e-6), (15, torch.float64, 1e-6), (14, torch.float32, 1e-4), (23, torch.float32, 1e-4)],
)
def test_torch_market_matches_numpy_market_given_the_same_draws(features: int, dtype: torch.dtype, tol: float) -> None:
    """Same observations, rewards and ends over 60 steps of 3 envs (12 episodes each, auto-reset)."""
    kwargs = {"switch": 0.3}  # regime flips often enough to be exercised
    params = MarketParams.of(features, 5, **kwargs)
    market = TorchMarket(3, seed=11, device="cpu", params=params, dtype=dtype)
    extra = features - 14
    envs, rngs = [], []
    for i in range(3):
        env, rng = MarketEnv(features, 5, **kwargs), ScriptedRng()
        env.np_random = rng  # type: ignore[assignment]
        queue_reset(rng, market.noise, i, extra)
        obs, _ = env.reset()
        envs.append(env)
        rngs.append(rng)
        torch.testing.assert_close(market.state.obs[i], torch.from_numpy(obs), rtol=tol, atol=tol)
    actions = torch.Generator().manual_seed(0)
    flips = 0
    for step in range(60):
        action = torch.randint(0, 5, (3, 3), generator=actions)
        regime_before = market.state.regime.clone()
        out = market.step(action)
        flips += int((market.state.regime != regime_before).sum())
        assert not out.terminated.any()
        assert out.truncated.tolist() == [step % 5 == 4] * 3
        for i, (env, rng) in enumerate(zip(envs, rngs, strict=True)):
            queue_step(rng, market.noise, i, extra)
            next_obs, reward, terminated, truncated, _ = env.step(action[i].numpy())
            torch.testing.assert_close(out.next_obs[i], torch.from_numpy(next_obs), rtol=tol, atol=tol)
            assert float(out.reward[i]) == pytest.approx(reward, abs=tol)
            assert (terminated, truncated) == (False, bool(out.truncated[i]))
            if truncated:
                queue_reset(rng, market.noise, i, extra)
                next_obs, _ = env.reset()
            torch.testing.assert_close(market.state.obs[i], torch.from_numpy(next_obs), rtol=tol, atol=tol)
            assert not rng.normals and not rng.uniforms  # every draw NumPy made was one the torch env made
    assert flips > 0


def test_auto_reset_starts_fresh_episodes_and_steps_are_seeded() -> None:
    params = MarketParams.of(20, 8)
    a = TorchMarket(4, seed=3, device="cpu", params=params)
    b = TorchMarket(4, seed=3, device="cpu", params=params)
    c = TorchMarket(4, seed=4, device="cpu", params=params)
    action = torch.full((4, 3), 4)
    for _ in range(8):
        out_a, out_b, out_c = a.step(action), b.step(action), c.step(action)
        assert torch.equal(out_a.next_obs, out_b.next_obs) and torch.equal(out_a.reward, out_b.reward)
        assert not torch.equal(out_a.next_obs, out_c.next_obs)
    assert out_a.truncated.all()
    assert torch.equal(out_a.next_obs[:, POSITIONS], torch.ones(4, 3))  # the final obs holds the positions
    assert torch.equal(out_a.next_obs[:, 6], torch.zeros(4))  # no steps left
    state = a.state
    assert torch.equal(state.t, torch.zeros(4, dtype=torch.int64))
    assert torch.equal(state.position, torch.zeros(4, 3, dtype=torch.float64))
    assert torch.equal(state.obs[:, 6], torch.ones(4))  # a full horizon ahead
    assert torch.isin(state.obs[:, GOAL], torch.tensor(LEVELS, dtype=torch.float32)).all()


def test_stepping_with_the_host_s_episode_ends_gives_the_static_path_s_results_exactly() -> None:
    """`ended` from the host (every env ends at once) skips the reset on other steps; same numbers."""
    params = MarketParams.of(20, 6)
    static, told = (TorchMarket(4, seed=3, device="cpu", params=params) for _ in range(2))
    actions = torch.Generator().manual_seed(0)
    for t in range(15):  # across two episode ends
        action = torch.randint(0, 5, (4, 3), generator=actions)
        a, b = static.step(action), told.step(action, ended=(t + 1) % 6 == 0)
        for f in fields(a):
            assert torch.equal(getattr(a, f.name), getattr(b, f.name)), (t, f.name)
        for f in fields(MarketState):
            assert torch.equal(getattr(static.state, f.name), getattr(told.state, f.name)), (t, f.name)
    assert torch.equal(static.generator.get_state(), told.generator.get_state())


def test_source_rows_goal_columns_and_replay() -> None:
    source = TorchMarketSource(4, seed=0, device="cpu", features=16, horizon=8)
    assert (source.spec.obs_dim, source.spec.branches, source.spec.actions) == (16, 3, 5)
    generator = torch.Generator().manual_seed(0)
    rows = [source.collect(None, 1.0, generator) for _ in range(20)]
    last = torch.stack([r.last for r in rows])  # [T, N]
    step = torch.stack([r.episode_step for r in rows if r.episode_step is not None])
    assert torch.equal(step[:, 0], torch.arange(20) % 8)
    assert torch.equal(last, (step == 7))
    for before, after in itertools.pairwise(rows):
        if before.last.any():  # a fresh episode: flat positions, not the final obs
            assert torch.equal(after.obs[:, POSITIONS], torch.zeros(4, 3))
        else:
            assert torch.equal(after.obs, before.next_obs)
    first = rows[0]
    assert first.achieved_goal is not None and first.base_reward is not None
    torch.testing.assert_close(first.achieved_goal, first.next_obs[:, POSITIONS])
    goal_term = -0.004 * (first.achieved_goal - first.obs[:, GOAL]).abs().sum(1)
    torch.testing.assert_close(first.base_reward, first.reward - goal_term)
    assert torch.equal(first.done, torch.zeros(4))
    returns = source.finished_returns
    assert len(returns) == 8  # two episodes of four envs
    assert sum(returns) == pytest.approx(float(sum(r.reward.sum() for r in rows[:16])), rel=1e-5)
    config = build_config({"replay": {"capacity": 128}, "data": {"num_envs": 4}, "run": {"batch_size": 8}})
    buffer = ReplayBuffer(config, source.spec, "cpu", generator)
    for r in rows:
        buffer.add(r)
    assert len(buffer) == 80 and buffer.sample(8, 0).obs.shape == (8, 16)


def test_torch_signal_policy_matches_numpy_and_beats_random_by_a_margin() -> None:
    """The hand-written baseline: follows sign(regime) * alpha. A learned policy must beat it (docs/results.md)."""
    obs = torch.randn(500, 64, generator=torch.Generator().manual_seed(0)) * 2
    assert np.array_equal(signal_policy(obs).numpy(), signal_policy_np(obs.numpy()))
    source = TorchMarketSource(1, seed=0, device="cpu")
    signal = source.evaluate(signal_policy, 16, seed=100)
    generator = torch.Generator().manual_seed(1)
    random = source.evaluate(lambda o: torch.randint(0, 5, (o.shape[0], 3), generator=generator), 16, seed=100)
    assert np.mean(random) < -1.0
    assert np.mean(signal) > 2.0
    assert np.mean(signal) - np.mean(random) > 8.0  # about 6.7 against -3.7 here
    assert min(signal) > max(random)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_baselines_play_the_evaluation_s_markets_with_seeded_policies(backend: str) -> None:
    config = build_config(
        {"data": {"num_envs": 2, "market_features": 20, "market_horizon": 30, "market_backend": backend}}
    )
    source = make_source(config, "cpu")
    played = baseline_returns(source.evaluate, 6, seed=500)
    assert list(played) == ["heuristic", "random"] and all(len(values) == 6 for values in played.values())
    assert played == baseline_returns(source.evaluate, 6, seed=500)  # the same seed, the same episodes and draws
    assert played["heuristic"] == source.evaluate(signal_policy, 6, seed=500)
    assert np.mean(played["heuristic"]) > np.mean(played["random"])
    obs = torch.zeros(4, 20)
    actions = random_policy(1)(obs)
    assert actions.shape == (4, 3) and actions.dtype == torch.int64 and int(actions.max()) < len(LEVELS)
    assert torch.equal(actions, random_policy(1)(obs)) and not torch.equal(actions, random_policy(2)(obs))


def test_make_source_picks_the_torch_market_by_backend() -> None:
    def build(backend: str) -> object:
        config = build_config({"data": {"num_envs": 2, "market_features": 20, "market_backend": backend}})
        return make_source(config, "cpu")

    assert isinstance(build("torch"), TorchMarketSource)
    assert isinstance(build("numpy"), GymSource)
    assert isinstance(build("auto"), GymSource)  # auto takes torch only on a CUDA device


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_collection_never_syncs_and_dynamics_match_the_cpu() -> None:
    source = TorchMarketSource(8, seed=0, device="cuda", horizon=8)
    generator = torch.Generator(device="cuda").manual_seed(0)
    source.collect(signal_policy, 0.1, generator)  # warm-up (lazy CUDA initialisation)
    torch.cuda.set_sync_debug_mode("error")
    try:
        rows = [source.collect(signal_policy, 0.1, generator) for _ in range(10)]  # across an auto-reset
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rows[0].obs.is_cuda and rows[0].reward.is_cuda and not rows[0].last.is_cuda
    # the same dynamics on the CPU, fed the CUDA env's draws
    market = source.market
    cpu = MarketDynamics(market.params, torch.device("cpu"))
    noise = MarketNoise(8, market.params.obs_noise, torch.device("cpu"), torch.float64)
    for _ in range(10):
        state = MarketState(**{f.name: getattr(market.state, f.name).cpu() for f in fields(MarketState)})
        action = torch.randint(0, 5, (8, 3), device="cuda")
        out = market.step(action)
        noise.normal.copy_(market.noise.normal)
        noise.uniform.copy_(market.noise.uniform)
        after, expected = cpu.step(state, action.cpu(), noise)
        torch.testing.assert_close(out.next_obs.cpu(), expected.next_obs)
        torch.testing.assert_close(out.reward.cpu(), expected.reward)
        torch.testing.assert_close(market.state.obs.cpu(), after.obs)
