"""A pack's collection as one: every live run's acting, stepping and storing batched (issue 31).

Collected run by run, a pack of K runs does K policy forwards, K ε-greedy draws and K replay adds per
update, where its update is one vmapped step: at K = 16 on CartPole, collection was most of the pack's time. Here
one env step of the pack is

- act: one greedy forward of every live run, `greedy_action` vmapped over the pack's stacked online parameters
  [L, P] and the runs' observations [L, N, F] (the products become batched products, as in the pack's step);
- env: each run's ε-greedy draws from its own explore generator, in its solo run's order (K draw kernels: a
  generator's numbers cannot be drawn in a batch), one batched pick between random and greedy, then the runs' envs
  stepped (`PackEnvs`): Gymnasium's (`GymPackEnvs`: one copy of every run's actions to the host, each run's own
  vector env stepped with its own), or the torch market's (`trainer.execution.pack_market.MarketPackEnvs`: every
  run's N markets one batch of K x N on the device, each run's noise from its own generator);
- store: the runs' writers move their host bookkeeping on (`advance_many`: all runs in one pass), then the rows of
  every live run go into the stacked storage [K, C, ...] with one indexed write per column, and the new slots'
  priorities into the stacked sum-trees, whose changed paths are summed (`sum_paths`) or, on a GPU, whole levels
  of all K trees at once (one kernel a level).

Each run keeps its envs, episode statistics and generators, so run i collects what its solo run would: the
same transitions, bit for bit where the batched forward picks the same greedy actions as one run's forward. On
the CPU it does (`tests/trainer/execution/test_pack_collect.py`: rows, priorities, bookkeeping, returns and
generators equal; `tests/trainer/runtime/test_pack_train.py`: a packed run's parameters and evaluations equal its
solo run's). On a GPU a batched product may sum in another order than one run's, so where two actions' expected
returns differ by a rounding the greedy pick can differ, as the pack's step itself differs there within its
stated tolerance (`tests/trainer/execution/test_pack.py`). A run not in `live` (a frozen run) collects nothing.

On a GPU, where every run is live, a step's device work replays as CUDA graphs (the host's dispatch of its few
hundred small kernels was most of a pack step): a Gymnasium step's as two graphs around the host's envs
(`step_captured`: choosing the actions, storing the rows); the torch market's, whose host values are all known
ahead (the writers' bookkeeping, ε, where episodes end), as one graph per block of a plan call's steps
(`collect_block`). The graphs read static buffers the step's values are copied into (`BlockPlan`, one array).

`evaluate` plays the runs' greedy episodes side by side the same way (each run's own seeds and envs, one
batched forward a step): run i's returns are those its source's `evaluate` gives.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from contracts.packs import PackError
from trainer.algo.model import greedy_action
from trainer.algo.replay.sampler import sum_paths
from trainer.algo.replay.storage import TensorStorage
from trainer.algo.replay.writer import HostAdd, RingWriter, advance_many, backfill_host
from trainer.algo.rng import RANDINT, UNIFORM, rows_draw_
from trainer.execution.collect import CaptureFn, Phase, Replayable, graph_capture
from trainer.execution.data.gym_source import GymSource, linear_epsilon
from trainer.execution.data.market_torch import TorchMarketSource
from trainer.execution.data.transfer import host_into, host_to_device
from trainer.execution.pack import Pack
from trainer.execution.pack_envs import GymPackEnvs, PackEnvs, PackRows
from trainer.execution.pack_market import MarketPackEnvs
from trainer.runtime.timing import StepTimer


class BlockPlan(NamedTuple):
    """What the host knows of M collection steps of L runs, on the device (one copy each): the writers'
    bookkeeping (`RingWriter.advance` of each step) and each run's ε."""

    slots: Tensor  # [M, L, N] int64, where each step's rows go
    meta: Tensor  # [M, L, 5, N] int64, their bookkeeping (`TensorStorage.META`)
    lengths: Tensor  # [M, L, N] int64, each stream's running episode length after the step
    sizes: Tensor  # [M, L] int64, the rows each run's replay holds after the step
    threshold: Tensor  # [M, L, 1, 1] float32, each run's ε at the step's update

    @classmethod
    def of(cls, packed: Tensor, threshold: Tensor) -> BlockPlan:
        """The plan as views of `packed` [M, L, 7 N + 1] int64 (`PackCollector.plan_host`'s layout: one copy)."""
        n = (packed.shape[-1] - 1) // 7
        meta = packed[..., n : 6 * n].unflatten(-1, (5, n))
        return cls(packed[..., :n], meta, packed[..., 6 * n : 7 * n], packed[..., 7 * n], threshold)


class StaticPlan(NamedTuple):
    """The buffers a captured body reads its `BlockPlan` from; each replay's plan is copied in first."""

    packed: Tensor  # [M, L, 7 N + 1] int64
    threshold: Tensor  # [M, L, 1, 1] float32

    def load(self, packed: np.ndarray, epsilon: np.ndarray) -> BlockPlan:
        host_into(self.packed, packed)
        host_into(self.threshold, epsilon)
        return BlockPlan.of(self.packed, self.threshold)


class GymBuffers(NamedTuple):
    """The static tensors a Gymnasium pack step's graphs read and write (`step_captured`)."""

    obs: Tensor  # [K, N, F]
    action: Tensor  # [K, N, B] int64
    rows: PackRows  # next_obs [K, N, F], reward and done [K, N] (not `last`: the host's)
    plan: StaticPlan  # one step's, its ε for the choice of actions


def pack_envs(sources: Sequence[object], device: torch.device) -> PackEnvs:
    """The runs' envs as one: all Gymnasium sources (goal-free), or all torch markets; else `PackError`."""
    gym = [source for source in sources if isinstance(source, GymSource)]
    if len(gym) == len(sources):
        if any(source.spec.goal is not None for source in gym):
            raise PackError("a pack collects goal-conditioned Gymnasium rows run by run")
        return GymPackEnvs(gym, device)
    markets = [source for source in sources if isinstance(source, TorchMarketSource)]
    if len(markets) == len(sources):
        return MarketPackEnvs(markets)
    raise PackError("a pack collects as one from Gymnasium sources or the torch market (data.market_backend torch)")


class PackCollector:
    """Collects for a pack's live runs at once; run i steps `sources[i]` and draws from `explore[i]`."""

    def __init__(self, pack: Pack, sources: Sequence[object], explore: Sequence[torch.Generator]) -> None:
        if len(sources) != pack.size or len(explore) != pack.size:
            raise PackError(f"a pack of {pack.size} runs collects from one source and generator per run")
        writers = [replay.writer for replay in pack.replays]
        if not all(isinstance(writer, RingWriter) for writer in writers):
            raise PackError("a pack collects as one through the replay's host writer (run.collect_graph=false)")
        self.envs = pack_envs(sources, pack.device)
        self.pack, self.explore = pack, list(explore)
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
        self.capture: CaptureFn | None = graph_capture(self.device)  # on a GPU: steps and blocks as CUDA graphs
        self.graphs: dict[object, Replayable] = {}  # the market's pattern of episode ends, or a Gym step's part
        self.block_plans: dict[int, StaticPlan] = {}  # steps of a market block -> the plan its graphs read
        self.gym_buffers: GymBuffers | None = None  # what a Gym step's graphs read and write

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
        with each run's own schedule; timed as act, env and store on `timer` (the pack's collection is one), or
        as `collect_graph` where the block is one CUDA graph replay (`collect_block`)."""
        if not live:
            return
        index = self.live_index(live)  # [L]
        steps = updates * self.env_steps
        if isinstance(self.envs, MarketPackEnvs) and len(live) == self.pack.size and steps <= self.envs.horizon:
            self.collect_block(list(live), index, step, updates, timer)
            return
        for update in range(step, step + updates):
            epsilon = self.epsilons(live, [update])  # [1, L, 1, 1]
            for _ in range(self.env_steps):
                self.step(list(live), index, epsilon, timer)

    def epsilons(self, live: Sequence[int], updates: Sequence[int]) -> np.ndarray:
        """Each run's ε at each of `updates`, [U, L, 1, 1] float32: a float32 tensor compared with a Python float
        (the solo run's `epsilon_greedy`) compares in float32 too."""
        epsilon = [[linear_epsilon(update, *self.schedules[i]) for i in live] for update in updates]
        return np.asarray(epsilon, dtype=np.float32)[..., None, None]

    def step(self, live: list[int], index: Tensor, epsilon: np.ndarray, timer: StepTimer) -> None:
        """One step of every live run's envs (ε `epsilon` [1, L, 1, 1]): act, step, store (`step_captured` where
        it can be)."""
        if self.capture is not None and isinstance(self.envs, GymPackEnvs) and len(live) == self.pack.size:
            self.step_captured(live, index, epsilon, timer)
            return
        with timer.section("act"):
            obs = self.envs.observe(live, index)  # [L, N, F]
            threshold = self.to_device(epsilon)
            action = self.choose(live, index, obs, threshold[0])  # [L, N, K]
        with timer.section("env"):
            rows = self.envs.step(live, index, obs, action)
        with timer.section("store"):
            plans = advance_many([self.writers[i] for i in live], rows.last)
            block = BlockPlan.of(self.to_device(self.plan_host(live, [plans])), threshold)
            self.store(live, index, obs, action, rows, block, 0)
            self.backfill(live, [plans])

    def choose(self, live: list[int], index: Tensor, obs: Tensor, threshold: Tensor) -> Tensor:
        """The live runs' ε-greedy actions [L, N, K] on `obs` [L, N, F] (ε `threshold` [L, 1, 1])."""
        with torch.no_grad():
            greedy = self.act(live, index, obs.to(torch.float32)).to(torch.int64)  # [L, N, K]
        return self.epsilon_greedy(greedy, live, threshold)

    def step_captured(self, live: list[int], index: Tensor, epsilon: np.ndarray, timer: StepTimer) -> None:
        """`step` of Gymnasium envs on a GPU with its device work as two CUDA graphs around the envs, which run on
        the host: choosing the actions (the batched forward and each run's draws), and storing the rows. Each
        replays on static buffers that the step's values are copied into; the host then launches two graphs and a
        few copies a step instead of some hundred kernels (Python's dispatch of each was most of a pack step)."""
        assert isinstance(self.envs, GymPackEnvs)
        with timer.section("act"):
            static = self.gym_buffers
            if static is None:
                static = self.gym_buffers = self.gym_static(len(live))
            host_into(static.obs, np.stack([self.envs.sources[i].observation for i in live]))
            host_into(static.plan.threshold, epsilon)

            def choose() -> None:
                static.action.copy_(self.choose(live, index, static.obs, static.plan.threshold[0]))

            self.captured("act", choose, self.explore).replay()
        with timer.section("env"):
            rows = self.envs.step(live, index, static.obs, static.action, into=static.rows)
        with timer.section("store"):
            plans = advance_many([self.writers[i] for i in live], rows.last)
            block = static.plan.load(self.plan_host(live, [plans]), epsilon)
            store = functools.partial(self.store, live, index, static.obs, static.action, static.rows, block, 0)
            self.captured("store", store).replay()
            self.backfill(live, [plans])

    def gym_static(self, runs: int) -> GymBuffers:
        """The static buffers of `step_captured` for `runs` runs, in the dtypes the envs yield."""
        assert isinstance(self.envs, GymPackEnvs)
        n, features = self.streams, self.envs.sources[0].observation.shape[-1]
        obs_dtype = torch.from_numpy(self.envs.sources[0].observation[:0]).dtype
        zeros = functools.partial(torch.zeros, device=self.device)
        rows = PackRows(zeros((runs, n, features), dtype=obs_dtype), zeros((runs, n)), zeros((runs, n)), np.zeros(0))
        plan = StaticPlan(zeros((1, runs, 7 * n + 1), dtype=torch.int64), zeros((1, runs, 1, 1)))
        action = zeros((runs, n, self.dims.branches), dtype=torch.int64)
        return GymBuffers(zeros((runs, n, features), dtype=obs_dtype), action, rows, plan)

    def epsilon_greedy(self, greedy: Tensor, live: list[int], threshold: Tensor) -> Tensor:
        """`epsilon_greedy` of each run (ε `threshold` [L, 1, 1]), its draws from its own generator in its solo
        order ([L, N, K])."""
        n, k = greedy.shape[1:]
        draw = torch.empty((len(live), n, 1), device=self.device)  # [L, N, 1]
        random = torch.empty((len(live), n, k), dtype=torch.int64, device=self.device)  # [L, N, K]
        rows_draw_(draw, self.explore, UNIFORM, live)
        rows_draw_(random, self.explore, RANDINT, live, high=self.actions)
        return torch.where(draw < threshold, random, greedy)

    # ---- the torch market's blocks: every host value known up front, so a block can be one graph ----------------

    def collect_block(self, live: list[int], index: Tensor, step: int, updates: int, timer: StepTimer) -> None:
        """The M = updates x `data.env_steps_per_update` steps of every run's markets, which all end their episodes
        at steps the host knows (`Phase`): the writers' bookkeeping and ε of all M steps made first and copied to the
        device at once (`BlockPlan`), then the block's device work (`block_body`), captured on a GPU as one CUDA
        graph per pattern of episode ends and replayed (timed as `collect_graph`), then the host's part."""
        assert isinstance(self.envs, MarketPackEnvs)
        envs, steps = self.envs, updates * self.env_steps
        ends = Phase(envs.episode_step, steps).ends(envs.horizon)
        writers = [self.writers[i] for i in live]
        plans = [advance_many(writers, np.full((len(live), self.streams), end)) for end in ends]
        packed = self.plan_host(live, plans)
        epsilon = self.epsilons(live, [step + m // self.env_steps for m in range(steps)])
        if self.capture is None:
            self.block_body(live, index, ends, BlockPlan.of(self.to_device(packed), self.to_device(epsilon)), timer)
        else:
            with timer.section("collect_graph"):
                self.block_graph(live, index, ends, packed, epsilon).replay()
        envs.advance(steps, ended=any(ends))
        self.backfill(live, plans)

    def block_body(
        self, live: list[int], index: Tensor, ends: tuple[bool, ...], block: BlockPlan, timer: StepTimer | None
    ) -> None:
        """A block's device work, step m ending every episode iff ends[m]; timed on `timer` (None: captured)."""
        assert isinstance(self.envs, MarketPackEnvs)

        def section(name: str) -> AbstractContextManager[object]:
            return timer.section(name) if timer is not None else contextlib.nullcontext()

        for m, last in enumerate(ends):
            with section("act"):
                obs = self.envs.observe(live, index)  # [L, N, F]
                with torch.no_grad():
                    greedy = self.act(live, index, obs).to(torch.int64)  # [L, N, K]
            with section("env"):
                action = self.epsilon_greedy(greedy, live, block.threshold[m])
                rows = self.envs.step_rows(live, index, obs, action, last)
            with section("store"):
                self.store(live, index, obs, action, rows, block, m)

    def block_graph(
        self, live: list[int], index: Tensor, ends: tuple[bool, ...], packed: np.ndarray, epsilon: np.ndarray
    ) -> Replayable:
        """The block's graph for its pattern of episode ends, captured the first time the pattern comes. The
        graph reads its plan from static buffers, which the block's (`packed`, `epsilon`) is copied into. Capturing
        warms the body up on the block's own plan: it writes the rows of the slots the replay then writes again
        (the replay overwrites every column there, the priorities' sums are recomputed from the leaves), and steps
        the markets and draws numbers, which are put back (`device_state`, the generators) before the replay."""
        assert isinstance(self.envs, MarketPackEnvs) and self.capture is not None
        static = self.block_plans.get(len(ends))
        if static is None:
            static = self.block_plans[len(ends)] = StaticPlan(
                torch.empty(packed.shape, dtype=torch.int64, device=self.device),
                torch.empty(epsilon.shape, device=self.device),
            )
        block = static.load(packed, epsilon)
        generators = [*self.explore, *self.envs.generators()]
        body = functools.partial(self.block_body, live, index, ends, block, None)
        return self.captured(ends, body, generators, self.envs.device_state())

    def captured(
        self,
        key: object,
        body: Callable[[], None],
        generators: Sequence[torch.Generator] = (),
        state: Sequence[Tensor] = (),
    ) -> Replayable:
        """The graph of `body` under `key`, captured the first time. Capturing runs the body (its warm-up), which
        draws from `generators` and writes `state`: both are put back, so that the first replay does what the body
        would have done. What else the warm-up writes, the replay writes again (the bodies here read static
        buffers that hold the step's own values before the capture)."""
        graph = self.graphs.get(key)
        if graph is None:
            assert self.capture is not None
            saved = [tensor.clone() for tensor in state]
            states = [generator.get_state() for generator in generators]
            graph = self.graphs[key] = self.capture(body, generators)
            with torch.no_grad():
                for tensor, value in zip(state, saved, strict=True):
                    tensor.copy_(value)
            for generator, value in zip(generators, states, strict=True):
                generator.set_state(value)
        return graph

    # ---- storing ---------------------------------------------------------------------------------------------

    def plan_host(self, live: list[int], plans: list[list[HostAdd]]) -> np.ndarray:
        """M steps' writer plans (`plans[m][row]`, run live[row]) as one array [M, L, 7 N + 1] (`BlockPlan.of`):
        slots, bookkeeping, running episode lengths and replay sizes; made after the writers' `advance` of all M."""
        serial = np.stack([[plan.serial for plan in step] for step in plans])  # [M, L, N]
        meta = np.stack([[plan.meta for plan in step] for step in plans])  # [M, L, 5, N]
        lengths = np.stack([[plan.stream_step for plan in step] for step in plans])  # [M, L, N]
        # rows each run holds after step m: its writer's count then, less the rows of its later steps
        written = np.asarray([self.writers[i].written for i in live])  # [L]
        later = np.arange(len(plans) - 1, -1, -1)[:, None] * self.streams  # [M, 1]
        sizes = np.minimum(written[None, :] - later, self.capacity)  # [M, L]
        flat = meta.reshape(*meta.shape[:2], -1)  # [M, L, 5 N]
        return np.concatenate([serial % self.capacity, flat, lengths, sizes[..., None]], axis=-1, dtype=np.int64)

    def store(
        self, live: list[int], index: Tensor, obs: Tensor, action: Tensor, rows: PackRows, block: BlockPlan, m: int
    ) -> None:
        """Every live run's rows (`obs` [L, N, F] and `action` [L, N, K] as acted on, the envs' columns in `rows`)
        into its rows of the stacked replay at step m of `block`, as each run's `ReplayBuffer.add` would write them
        (the episodes they end are back-filled by the host afterwards: `backfill`)."""
        storage, n = self.pack.storage, self.streams
        slots = block.slots[m]  # [L, N]
        run = index[:, None].expand(-1, n)  # [L, N]
        storage["obs"][run, slots] = obs.to(storage["obs"].dtype)
        storage["next_obs"][run, slots] = rows.next_obs.to(storage["next_obs"].dtype)
        storage["action"][run, slots] = action
        storage["reward"][run, slots] = rows.reward
        storage["done"][run, slots] = rows.done
        if rows.achieved_goal is not None and rows.base_reward is not None:
            storage["achieved_goal"][run, slots] = rows.achieved_goal
            storage["base_reward"][run, slots] = rows.base_reward
        for row, name in enumerate(TensorStorage.META):
            storage[name][run, slots] = block.meta[m, :, row]
        self.prioritise(live, index, run, slots)
        self.pack.sampler["size"][index] = block.sizes[m]
        storage["stream_len"][index] = block.lengths[m]

    def backfill(self, live: list[int], plans: list[list[HostAdd]]) -> None:
        """The lengths of the episodes that `plans`' steps ended into their rows still in each ring now (a row
        written since over one of them keeps its own: the same as back-filling at the step the episode ended)."""
        for step in plans:
            for i, plan in zip(live, step, strict=True):
                if len(plan.ended_start):
                    written = self.writers[i].written
                    backfill_host(self.storages[i], plan.ended_start, plan.ended_length, self.streams, written)

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

    def evaluate(self, runs: Sequence[int], episodes: int, seeds: Sequence[int]) -> list[list[float]]:
        """Each run in `runs`'s `episodes` greedy returns ([R][episodes]) from its seed (its source's `evaluate`),
        all of them played at once, one batched forward of every run's current network a step."""
        if not runs or episodes == 0:
            return [[] for _ in runs]
        online = self.pack.state["online"]
        if len(runs) < self.pack.size:
            online = online[torch.tensor(list(runs), dtype=torch.int64, device=self.device)]  # [R, P]
        return self.envs.evaluate(runs, episodes, seeds, online, self.greedy)
