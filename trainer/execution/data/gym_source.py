"""Online data from any Gymnasium env with discrete actions, collected epsilon-greedily in parallel.

Supported: Discrete(n) actions (K = 1, A = n) or MultiDiscrete with equal sizes (K = len(nvec),
A = nvec[0]); Box observations (flattened) or goal Dicts {observation, achieved_goal, desired_goal}
(concatenated in that order, with a GoalSpec on the last two parts). Envs with Box observations may
declare a goal themselves through an `unwrapped.goal_spec()` method (the market env does).

The N envs run in a Gymnasium vector env: `SyncVectorEnv` (one process, envs stepped in turn),
`AsyncVectorEnv` (one worker process per env, stepped in parallel) or `ProcessVectorEnv` (all N in one
worker process of their own: a pack's runs step in parallel). With a worker, `start_collect` sends the
actions and returns at once, so the learner can run while the envs step, and `finish_collect` gathers the
rows. Every call yields exactly N real transitions, with next_obs the true successor, whatever
the vector env's autoreset mode:
- same-step (the default here): an ending `step` returns the reset obs, and the real final obs in
  `info["final_obs"]`, which becomes that row's next_obs;
- next-step (Gymnasium's own default) or disabled: an ending `step` returns the real final obs, and
  the source resets the ended envs at once (`reset` with a `reset_mask`), so the vector env never
  takes the reset step whose row (action ignored, reward 0) is no transition.
done = terminated only; `last` also marks truncation, which ends the episode for bookkeeping
without cutting the bootstrap. Env i is seeded seed + i at the start; later resets continue its
generator, so a run is reproducible whichever vector env and mode collect it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from torch import Tensor

from contracts.config import ConfigError, check_env_id
from trainer.algo.rng import randint_, uniform_
from trainer.execution.data.process_env import Episodes, EpisodesInWorker, ProcessVectorEnv
from trainer.execution.data.spec import EnvSpec, GoalSpec, Transitions, goal_columns
from trainer.execution.data.transfer import host_to_device

GreedyFn = Callable[[Tensor], Tensor]
"""Greedy action of a policy: obs [N, F] float32 -> actions [N, K] int64, on the training device."""

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")

VectorKind = Literal["sync", "async", "process"]


BACKGROUND = (AsyncVectorEnv, ProcessVectorEnv)
"""Vector envs that step in other processes: `send` starts their step, `finish_step` gathers it."""


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    """epsilon(step) = start + (end - start) * min(step / decay_steps, 1)."""
    return start + (end - start) * min(max(step, 0) / decay_steps, 1.0)


def epsilon_greedy(greedy: Tensor, epsilon: float | Tensor, actions: int, generator: torch.Generator) -> Tensor:
    """Per env, with probability epsilon a uniform random action vector, else the greedy one ([N, K])."""
    n, k = greedy.shape
    explore = uniform_(torch.empty(n, 1, device=greedy.device), generator) < epsilon  # [N, 1]
    random = randint_(torch.empty(n, k, dtype=torch.int64, device=greedy.device), actions, generator)  # [N, K]
    return torch.where(explore, random, greedy)


def _numpy_goal_reward(env: gym.Env[Any, Any]) -> Callable[[Tensor, Tensor], Tensor]:
    """Wrap a goal env's NumPy `compute_reward` as a tensor function (host round trip: not capturable)."""
    compute = env.unwrapped.compute_reward  # type: ignore[attr-defined]

    def reward(achieved: Tensor, desired: Tensor) -> Tensor:
        value = compute(achieved.detach().cpu().numpy(), desired.detach().cpu().numpy(), {})
        return torch.as_tensor(np.asarray(value), dtype=torch.float32, device=achieved.device)

    return reward


def _one_line(space: gym.Space[Any]) -> str:
    return " ".join(str(space).split())


def env_spec(env: gym.Env[Any, Any], env_id: str = "env") -> EnvSpec:
    """The EnvSpec of a single (unbatched) env, or a one-line ConfigError naming what is unsupported."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        branches, actions = 1, int(space.n)
    elif isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        sizes = sorted({int(n) for n in space.nvec})
        if len(sizes) != 1:
            raise ConfigError(
                f"{env_id}: MultiDiscrete action sizes {space.nvec.tolist()} differ; branches must share one size"
            )
        branches, actions = len(space.nvec), sizes[0]
    else:
        raise ConfigError(
            f"{env_id}: action space {_one_line(space)} is not supported (need Discrete or MultiDiscrete)"
        )
    if actions < 2:
        raise ConfigError(f"{env_id}: action space {_one_line(space)} has fewer than 2 actions per branch")
    obs_space = env.observation_space
    goal: GoalSpec | None = None
    if isinstance(obs_space, gym.spaces.Dict) and set(obs_space.spaces) == set(GOAL_KEYS):
        sizes_ = [int(np.prod(obs_space[key].shape or ())) for key in GOAL_KEYS]
        obs_dim = sum(sizes_)
        achieved = slice(sizes_[0], sizes_[0] + sizes_[1])
        desired = slice(sizes_[0] + sizes_[1], obs_dim)
        torch_reward = getattr(env.unwrapped, "torch_goal_reward", None)
        goal = GoalSpec(
            desired=desired,
            achieved=achieved,
            goal_reward=torch_reward or _numpy_goal_reward(env),
            capturable=torch_reward is not None,
        )
    elif isinstance(obs_space, gym.spaces.Box):
        obs_dim = int(np.prod(obs_space.shape))
        declared = getattr(env.unwrapped, "goal_spec", None)
        goal = declared() if callable(declared) else None
    else:
        raise ConfigError(
            f"{env_id}: observation space {_one_line(obs_space)} is not supported "
            f"(need Box or a goal Dict with {list(GOAL_KEYS)})"
        )
    return EnvSpec(obs_dim=obs_dim, branches=branches, actions=actions, goal=goal)


def flatten_obs(obs: Any) -> np.ndarray:
    """Batched obs ([N, ...] array or goal Dict of arrays) -> [N, F] float32."""
    if isinstance(obs, dict):
        n = len(obs[GOAL_KEYS[0]])
        return np.concatenate([np.asarray(obs[key]).reshape(n, -1) for key in GOAL_KEYS], 1).astype(np.float32)
    obs = np.asarray(obs)
    return obs.reshape(obs.shape[0], -1).astype(np.float32)


def _stack_final(final: Sequence[Any]) -> np.ndarray:
    """info["final_obs"] entries (arrays or Dicts) -> [M, F]."""
    if isinstance(final[0], dict):
        return flatten_obs({key: np.stack([f[key] for f in final]) for key in GOAL_KEYS})
    return flatten_obs(np.stack(final))


def _make_env(env_id: str, kwargs: dict[str, Any]) -> gym.Env[Any, Any]:
    check_env_id(env_id)  # right before gym.make, which imports the module of a `module:Name` id
    if env_id.startswith("foxhunt/"):  # also in a fresh worker process, whose registry lacks our ids
        from trainer.execution.data.market import register_market

        register_market()
    return gym.make(env_id, **kwargs)


def make_env_fn(env_id: str, env_kwargs: dict[str, Any] | None = None) -> Callable[[], gym.Env[Any, Any]]:
    """A picklable constructor for one env, with a one-line ConfigError if the id is unknown, or not of
    a registered id's form (a `module:Name` id, which Gymnasium would import the module of)."""
    check_env_id(env_id)
    if env_id.startswith("foxhunt/"):
        from trainer.execution.data.market import register_market

        register_market()
    try:
        gym.spec(env_id)
    except gym.error.Error as error:
        raise ConfigError(f"data.env_id: unknown Gymnasium environment {env_id!r} ({error})") from None
    return functools.partial(_make_env, env_id, dict(env_kwargs or {}))


def make_vector_env(
    make: Callable[[], gym.Env[Any, Any]], num_envs: int, vector: VectorKind, autoreset: AutoresetMode
) -> VectorEnv[Any, Any, Any]:
    """`num_envs` copies of `make()`: a worker process each when vector is "async" and there is more than one, all
    in one worker process when it is "process" (`ProcessVectorEnv`), else in this process."""
    fns = [make] * num_envs
    if vector == "async" and num_envs > 1:
        return AsyncVectorEnv(fns, autoreset_mode=autoreset)
    if vector == "process":
        return ProcessVectorEnv(make, num_envs, autoreset)
    return SyncVectorEnv(fns, autoreset_mode=autoreset)


VectorStep = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
"""What a vector env's `step` returns: observations, rewards, terminations, truncations, infos."""


@dataclass
class HostStep:
    """One step of N envs: `Transitions`' columns, those the envs produce still on the host (NumPy)."""

    obs: Tensor  # [N, F] on the device, as sent
    action: Tensor  # [N, K] int64 on the device
    reward: np.ndarray  # [N] float32
    next_obs: np.ndarray  # [N, F] float32
    done: np.ndarray  # [N] float32
    last: np.ndarray  # [N] bool
    episode_step: np.ndarray  # [N] int64


class GymSource:
    """N parallel envs; `collect` steps them all once epsilon-greedily and returns N transitions.

    `vector` picks the vector env ("async": worker processes, for envs whose step costs more than a
    round trip to a process); `autoreset` its autoreset mode (same-step saves a reset round trip).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        device: torch.device | str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        vector: VectorKind = "sync",
        autoreset: AutoresetMode = AutoresetMode.SAME_STEP,
    ) -> None:
        self.env_id = env_id
        self.device = torch.device(device)
        self._make = make_env_fn(env_id, env_kwargs)
        self._probe = self._make()  # an env in this process, for the spec (and a goal env's compute_reward)
        self.spec = env_spec(self._probe, env_id)
        self.envs = make_vector_env(self._make, num_envs, vector, autoreset)
        self.vector, self.autoreset = vector, autoreset
        self.num_envs = num_envs
        self._sent: tuple[Tensor, Tensor, np.ndarray] | None = None  # obs, action, env action of start_collect
        obs, _ = self.envs.reset(seed=seed)
        self._obs = flatten_obs(obs)  # [N, F]
        self._step = np.zeros(num_envs, dtype=np.int64)
        self._return = np.zeros(num_envs)
        self.finished_returns: list[float] = []
        """Undiscounted returns of episodes finished during collection (the train loop drains it)."""

    def env_action(self, action: np.ndarray) -> np.ndarray:
        space = self.envs.single_action_space
        if isinstance(space, gym.spaces.Discrete):
            return action[:, 0] + int(space.start)
        assert isinstance(space, gym.spaces.MultiDiscrete)  # the only other kind `env_spec` accepts
        return action + np.asarray(space.start)

    def collect(self, greedy_fn: GreedyFn | None, epsilon: float, generator: torch.Generator) -> Transitions:
        """Step every env once; actions epsilon-greedy around `greedy_fn` (uniform if it is None)."""
        self.start_collect(greedy_fn, epsilon, generator)
        return self.finish_collect()

    def start_collect(self, greedy_fn: GreedyFn | None, epsilon: float, generator: torch.Generator) -> None:
        """Pick the actions and send them (async envs start stepping); `finish_collect` returns the rows."""
        if self._sent is not None:
            raise RuntimeError("start_collect called twice without finish_collect")
        obs = host_to_device(self._obs, self.device)  # [N, F]
        if greedy_fn is None:
            greedy = torch.zeros(self.num_envs, self.spec.branches, dtype=torch.int64, device=self.device)
            epsilon = 1.0
        else:
            greedy = greedy_fn(obs).to(torch.int64)  # [N, K]
        action = epsilon_greedy(greedy, epsilon, self.spec.actions, generator)  # [N, K]
        self.send(obs, action, action.cpu().numpy())

    @property
    def observation(self) -> np.ndarray:
        """The obs every env acts on next [N, F] (host), what `start_collect` sends the policy."""
        return self._obs

    def send(self, obs: Tensor, action: Tensor, host_action: np.ndarray) -> None:
        """Step the envs with `action` [N, K] chosen on `obs` [N, F] (`host_action`: the same on the host);
        `finish_collect` returns the rows. For a caller that picks many sources' actions at once (a pack)."""
        if self._sent is not None:
            raise RuntimeError("send called twice without finish_collect")
        env_action = self.env_action(host_action)
        if isinstance(self.envs, BACKGROUND):
            self.envs.step_async(env_action)
        self._sent = (obs, action, env_action)

    def finish_collect(self) -> Transitions:
        """The N rows of the step `start_collect` began."""
        step = self.finish_step()
        rows = Transitions(
            obs=step.obs,
            action=step.action,
            reward=host_to_device(step.reward, self.device),
            next_obs=host_to_device(step.next_obs, self.device),
            done=host_to_device(step.done, self.device),
            last=torch.from_numpy(step.last),
            episode_step=torch.from_numpy(step.episode_step),
        )
        if self.spec.goal is not None:
            rows.achieved_goal, rows.base_reward = goal_columns(self.spec, rows.obs, rows.next_obs, rows.reward)
        return rows

    @property
    def joinable(self) -> bool:
        """Whether its envs can step inside a vector env of many sources' envs (`GymPackEnvs`): in this process,
        and reset in the step they end, so that no state of its own vector env carries from one step to the next."""
        return isinstance(self.envs, SyncVectorEnv) and self.autoreset == AutoresetMode.SAME_STEP

    def finish_step(self, stepped: VectorStep | None = None) -> HostStep:
        """The N rows of the step `start_collect` (or `send`) began, with their host columns left on the host:
        a pack copies many sources' columns to the device at once. `stepped`: this source's share of a step that a
        vector env of several `joinable` sources' envs took (the pack's, with the actions `send` was given)."""
        if self._sent is None:
            raise RuntimeError("finish_collect called without start_collect")
        obs, action, env_action = self._sent
        self._sent = None
        if stepped is not None:
            next_raw, reward, terminated, truncated, info = stepped
        elif isinstance(self.envs, BACKGROUND):
            next_raw, reward, terminated, truncated, info = self.envs.step_wait()
        else:
            next_raw, reward, terminated, truncated, info = self.envs.step(env_action)
        next_np = flatten_obs(next_raw)  # [N, F]: the real successors, except where same-step mode reset
        following = next_np  # the obs each env acts on next
        last = np.logical_or(terminated, truncated)
        if last.any():
            ended = np.flatnonzero(last)
            if self.autoreset == AutoresetMode.SAME_STEP:
                next_np = next_np.copy()
                next_np[ended] = _stack_final([info["final_obs"][i] for i in ended])
            else:  # reset now, so the vector env takes no reset step (a row that is no transition)
                reset_raw, _ = self.envs.reset(options={"reset_mask": last})
                following = flatten_obs(reset_raw)
        step = HostStep(
            obs=obs,
            action=action,
            reward=np.asarray(reward, dtype=np.float32),
            next_obs=next_np,
            done=terminated.astype(np.float32),
            last=np.asarray(last, dtype=bool),
            episode_step=self._step.copy(),
        )
        self._return += reward
        self.finished_returns.extend(self._return[last].tolist())
        self._return[last] = 0.0
        self._step = np.where(last, 0, self._step + 1)
        self._obs = following
        return step

    def episodes(self, seeds: Sequence[int]) -> Episodes | EpisodesInWorker:
        """Greedy evaluation's envs of this source's kind, env e seeded seeds[e]: in a worker process of their own
        where the source's envs are (`process`), so that a pack's runs play their evaluations in parallel."""
        if self.vector == "process":
            return EpisodesInWorker(self._make, seeds)
        return Episodes(self._make, seeds)

    def evaluate(self, greedy_fn: GreedyFn, episodes: int, seed: int) -> list[float]:
        """Undiscounted returns of `episodes` greedy episodes, env i seeded seed + i, run side by side."""
        play = Episodes(self._make, [seed + i for i in range(episodes)])
        obs = play.start()
        returns = [0.0] * episodes
        active = list(range(episodes))
        try:
            with torch.no_grad():
                while active:
                    batch = flatten_obs(batch_obs([obs[i] for i in active]))
                    action = greedy_fn(torch.from_numpy(batch).to(self.device)).to(torch.int64).cpu().numpy()
                    env_action = self.env_action(action)
                    outcomes = play.step([(i, env_action[row]) for row, i in enumerate(active)])
                    still = []
                    for i, (observation, reward, terminated, truncated) in zip(active, outcomes, strict=True):
                        obs[i] = observation
                        returns[i] += float(reward)
                        if not (terminated or truncated):
                            still.append(i)
                    active = still
        finally:
            play.close()
        return returns

    def close(self) -> None:
        self.envs.close()
        self._probe.close()


def batch_obs(items: list[Any]) -> Any:
    if isinstance(items[0], dict):
        return {key: np.stack([item[key] for item in items]) for key in GOAL_KEYS}
    return np.stack(items)
