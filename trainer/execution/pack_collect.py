"""A pack's collection as one: every live run's acting, stepping and storing batched (issue 31).

Collected run by run, a pack of K runs does K policy forwards, K ε-greedy draws and K replay adds per
update, where its update is one vmapped step: at K = 16 on CartPole, collection was most of the pack's time. Here
one env step of the pack is

- act: one greedy forward of every live run, `greedy_action` vmapped over the pack's stacked online parameters
  [L, P] and the runs' observations [L, N, F] (the products become batched products, as in the pack's step);
- env: each run's ε-greedy draws from its own explore generator, in its solo run's order (K draw kernels: a
  generator's numbers cannot be drawn in a batch), one batched pick between random and greedy, one copy of every
  run's actions to the host, then each run's own envs stepped with its own actions;
- store: each run's writer moves its host bookkeeping on (`RingWriter.advance`), then the rows of every live run
  go into the stacked storage [K, C, ...] with one indexed write per column, and the new slots' priorities into
  the stacked sum-trees, whose changed paths are summed (`sum_paths`) or, on a GPU, whole levels of all K trees
  at once (one kernel a level).

Each run keeps its envs, episode statistics and generators, so run i collects what its solo run would: the
same transitions, bit for bit where the batched forward picks the same greedy actions as one run's forward. On
the CPU it does (`tests/trainer/execution/test_pack_collect.py`: rows, priorities, bookkeeping, returns and
generators equal; `tests/trainer/runtime/test_pack_train.py`: a packed run's parameters and evaluations equal its
solo run's). On a GPU a batched product may sum in another order than one run's, so where two actions' expected
returns differ by a rounding the greedy pick can differ, as the pack's step itself differs there within its
stated tolerance (`tests/trainer/execution/test_pack.py`). A run not in `live` (a frozen run) collects nothing.

`evaluate` plays the runs' greedy episodes side by side the same way (each run's own seeds and envs, one
batched forward a step): run i's returns are those its `GymSource.evaluate` gives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from contracts.packs import PackError
from trainer.algo.model import greedy_action
from trainer.algo.replay.sampler import sum_paths
from trainer.algo.replay.storage import TensorStorage
from trainer.algo.replay.writer import HostAdd, RingWriter, backfill_host
from trainer.execution.data.gym_source import GymSource, HostStep, batch_obs, flatten_obs, linear_epsilon
from trainer.execution.data.transfer import host_to_device
from trainer.execution.pack import Pack
from trainer.runtime.timing import StepTimer


class PackCollector:
    """Collects for a pack's live runs at once; run i steps `sources[i]` and draws from `explore[i]`."""

    def __init__(self, pack: Pack, sources: Sequence[object], explore: Sequence[torch.Generator]) -> None:
        if len(sources) != pack.size or len(explore) != pack.size:
            raise PackError(f"a pack of {pack.size} runs collects from one source and generator per run")
        gym = [source for source in sources if isinstance(source, GymSource)]
        if len(gym) != pack.size:
            raise PackError("a pack collects as one from Gymnasium sources only (data.source gym, or the host market)")
        writers = [replay.writer for replay in pack.replays]
        if not all(isinstance(writer, RingWriter) for writer in writers):
            raise PackError("a pack collects as one through the replay's host writer (run.collect_graph=false)")
        if any(replay.storage.spec.goal is not None for replay in pack.replays):
            raise PackError("a pack collects goal-conditioned rows run by run")
        self.pack, self.sources, self.explore = pack, gym, list(explore)
        self.writers: list[RingWriter] = [w for w in writers if isinstance(w, RingWriter)]
        self.storages: list[TensorStorage] = [replay.storage for replay in pack.replays]
        self.device = pack.device
        state = pack.states[0]
        self.layout, self.dims, self.atoms = state.main, state.dims, state.atoms
        self.schedules = [(c.data.epsilon_start, c.data.epsilon_end, c.data.epsilon_decay_steps) for c in pack.configs]
        self.env_steps = pack.configs[0].data.env_steps_per_update
        self.streams = pack.configs[0].data.num_envs
        self.actions = state.dims.actions
        self.alphas = [replay.sampler.alpha for replay in pack.replays]
        sampler = pack.replays[0].sampler
        self.leaves, self.depth, self.capacity = sampler.leaves, sampler.depth, sampler.capacity
        self.whole_levels = self.device.type == "cuda"  # one kernel a level of all K trees: fewer launches
        self.greedy = torch.func.vmap(self._greedy)  # ([L, P], [L, N, F]) -> [L, N, K]
        self._indices: dict[tuple[int, ...], Tensor] = {}  # live runs -> their index [L] on the device

    def to_device(self, host: np.ndarray) -> Tensor:
        return host_to_device(host, self.device)

    def live_index(self, live: Sequence[int]) -> Tensor:
        key = tuple(live)
        if key not in self._indices:
            self._indices[key] = torch.tensor(key, dtype=torch.int64, device=self.device)
        return self._indices[key]

    def _greedy(self, online: Tensor, obs: Tensor) -> Tensor:
        """One run's greedy actions [N, K] from its flat parameters [P] (vmap's body)."""
        return greedy_action(self.layout.views(online), obs, self.dims, self.atoms)

    def act(self, live: list[int], index: Tensor, obs: Tensor) -> Tensor:
        """The greedy actions [L, N, K] of the live runs' networks on their `obs` [L, N, F]: one vmapped forward,
        or one run's own where one run is live (vmap's dispatch cost ~1 ms a call on the CPU, for nothing)."""
        online = self.pack.state["online"]  # [K, P]
        if len(live) == 1:
            return self._greedy(online[live[0]], obs[0])[None]
        return self.greedy(online if len(live) == self.pack.size else online[index], obs)

    def collect(self, live: Sequence[int], step: int, updates: int, timer: StepTimer) -> None:
        """The rows of updates step .. step + updates - 1 of every run in `live`, ε-greedy at each update's step
        with each run's own schedule; timed as act, env and store on `timer` (the pack's collection is one)."""
        if not live:
            return
        index = self.live_index(live)  # [L]
        for update in range(step, step + updates):
            epsilon = [linear_epsilon(update, *self.schedules[i]) for i in live]
            for _ in range(self.env_steps):
                self.step(list(live), index, epsilon, timer)

    def step(self, live: list[int], index: Tensor, epsilon: list[float], timer: StepTimer) -> None:
        """One step of every live run's envs: act, step, store."""
        with timer.section("act"):
            obs = self.to_device(np.stack([self.sources[i].observation for i in live]))  # [L, N, F]
            with torch.no_grad():
                greedy = self.act(live, index, obs.to(torch.float32)).to(torch.int64)  # [L, N, K]
        with timer.section("env"):
            action = self.epsilon_greedy(greedy, live, epsilon)  # [L, N, K]
            host = action.cpu().numpy()
            for row, i in enumerate(live):
                self.sources[i].send(obs[row], action[row], host[row])
            steps = [self.sources[i].finish_step() for i in live]
        with timer.section("store"):
            self.store(live, index, obs, action, steps)

    def epsilon_greedy(self, greedy: Tensor, live: list[int], epsilon: list[float]) -> Tensor:
        """`epsilon_greedy` of each run, its draws from its own generator in its solo order ([L, N, K])."""
        n, k = greedy.shape[1:]
        draw = torch.empty((len(live), n, 1), device=self.device)  # [L, N, 1]
        random = torch.empty((len(live), n, k), dtype=torch.int64, device=self.device)  # [L, N, K]
        for row, i in enumerate(live):
            torch.rand(n, 1, generator=self.explore[i], out=draw[row])
            torch.randint(0, self.actions, (n, k), generator=self.explore[i], out=random[row])
        # a float32 ε per run: a float32 tensor compared with a Python float compares in float32 too
        threshold = self.to_device(np.asarray(epsilon, dtype=np.float32))[:, None, None]  # [L, 1, 1]
        return torch.where(draw < threshold, random, greedy)

    def store(self, live: list[int], index: Tensor, obs: Tensor, action: Tensor, steps: list[HostStep]) -> None:
        """Every live run's rows (`obs` [L, N, F] and `action` [L, N, K] as acted on, the rest in `steps`) into its
        rows of the stacked replay, as each run's `ReplayBuffer.add` would write them."""
        pack, n = self.pack, self.streams
        plans: list[HostAdd] = [self.writers[i].advance(step.last) for i, step in zip(live, steps, strict=True)]
        serial = np.stack([plan.serial for plan in plans])  # [L, N]
        slots = self.to_device(serial % self.capacity)  # [L, N]
        run = index[:, None].expand(-1, n)  # [L, N]
        storage = pack.storage
        storage["obs"][run, slots] = obs.to(storage["obs"].dtype)
        next_obs = self.to_device(np.stack([step.next_obs for step in steps]))  # [L, N, F]
        storage["next_obs"][run, slots] = next_obs.to(storage["next_obs"].dtype)
        storage["action"][run, slots] = action
        host = np.stack([np.stack([step.reward, step.done]) for step in steps])  # [L, 2, N] float32
        columns = self.to_device(host)
        storage["reward"][run, slots] = columns[:, 0]
        storage["done"][run, slots] = columns[:, 1]
        meta = self.to_device(np.stack([plan.meta for plan in plans]))  # [L, 5, N]
        for row, name in enumerate(TensorStorage.META):
            storage[name][run, slots] = meta[:, row]
        self.prioritise(live, index, run, slots)
        for i, plan in zip(live, plans, strict=True):
            if len(plan.ended_start):
                backfill_host(self.storages[i], plan.ended_start, plan.ended_length, n, self.writers[i].written)
        lengths = np.stack([plan.stream_step for plan in plans])  # [L, N]
        storage["stream_len"][index] = self.to_device(lengths)

    def prioritise(self, live: list[int], index: Tensor, run: Tensor, slots: Tensor) -> None:
        """`PrioritizedSampler.on_write` of every live run: new slots get p = max priority so far, to the α."""
        sampler = self.pack.sampler
        alphas = [self.alphas[i] for i in live]
        if len(set(alphas)) == 1:  # pow by the Python float its solo run uses (by 0.5 it is a square root)
            mass = sampler["max_priority"][index].pow(alphas[0])  # [L] each run's max p^α
        else:
            mass = torch.stack([sampler["max_priority"][i].pow(alpha) for i, alpha in zip(live, alphas, strict=True)])
        leaves = slots + self.leaves  # [L, N]
        trees = sampler["tree"]  # [K, 2P]
        trees[run, leaves] = mass[:, None].expand_as(leaves)
        if self.whole_levels:
            for depth in range(self.depth - 1, -1, -1):
                children = trees[:, 2 << depth : 4 << depth].view(trees.shape[0], -1, 2)  # [K, 2^d, 2]
                torch.add(children[..., 0], children[..., 1], out=trees[:, 1 << depth : 2 << depth])
        else:
            sum_paths(trees, run.reshape(-1), leaves.reshape(-1), self.depth)
        sizes = [min(len(self.writers[i]), self.capacity) for i in live]
        sampler["size"][index] = self.to_device(np.asarray(sizes, dtype=np.int64))

    def evaluate(self, runs: Sequence[int], episodes: int, seeds: Sequence[int]) -> list[list[float]]:
        """`GymSource.evaluate` of every run in `runs` at once ([R][episodes] undiscounted returns): run r's episode
        e is seeded seeds[r] + e in an env of its own, all of them stepped side by side, with one greedy forward of
        every run's current network a step. Episodes that ended keep their last observation in the forward (static
        shapes) and are not stepped; their actions are not used."""
        if not runs or episodes == 0:
            return [[] for _ in runs]
        index = torch.tensor(list(runs), dtype=torch.int64, device=self.device)  # [R]
        online = self.pack.state["online"]
        if len(runs) < self.pack.size:
            online = online[index]  # [R, P]
        envs = [[self.sources[i].make_env() for _ in range(episodes)] for i in runs]
        starts = zip(envs, seeds, strict=True)
        first = [[env.reset(seed=seed + e)[0] for e, env in enumerate(row)] for row, seed in starts]
        obs = np.stack([flatten_obs(batch_obs(row)) for row in first])  # [R, E, F]
        returns = np.zeros((len(runs), episodes))  # [R, E]
        active = np.ones((len(runs), episodes), dtype=bool)  # [R, E]
        with torch.no_grad():
            while active.any():
                greedy = self.greedy(online, torch.from_numpy(obs).to(self.device)).to(torch.int64)  # [R, E, K]
                actions = greedy.cpu().numpy()
                for row, e in zip(*np.nonzero(active), strict=True):
                    source = self.sources[runs[row]]
                    env_action = source.env_action(actions[row, e : e + 1])[0]
                    observation, reward, terminated, truncated, _ = envs[row][e].step(env_action)
                    returns[row, e] += float(reward)
                    obs[row, e] = flatten_obs(batch_obs([observation]))[0]
                    active[row, e] = not (terminated or truncated)
        for row in envs:
            for env in row:
                env.close()
        return [[float(value) for value in row] for row in returns]
