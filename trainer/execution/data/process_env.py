"""A run's envs in one worker process of their own (`data.vector_env: process`).

Gymnasium's `AsyncVectorEnv` gives each env a process: right for one run whose few envs are slow, but a pack of
K runs of N envs each then runs K x N processes (64 for LunarLander's 16 x 4, on 16 cores), and each step is K x N
process round trips. Here each run's envs live in one worker:

- `ProcessVectorEnv`: collection's N envs, as the `SyncVectorEnv` a sync run steps in its own process;
- `EpisodesInWorker`: a greedy evaluation's episodes (`Episodes`, in the worker).

A pack's runs then step in parallel, one process and one round trip a run and step. A worker builds its envs with
the same constructor and seeds them as asked, so its rows and returns are those of the same envs in this process,
bit for bit (`tests/trainer/execution/data/test_process_env.py`, `test_gym_source.py`).

`step_async` sends the work and returns; `step_wait` gathers it (`GymSource.start_collect` and `finish_collect`,
and the pack's `GymPackEnvs`, which sends every run's work before gathering any). An error in a worker comes back
as `EnvWorkerError` with the worker's own traceback.
"""

from __future__ import annotations

import functools
import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space

JOIN_SECONDS = 5.0
"""How long `close` waits for a worker to end before it is terminated."""

Move = tuple[int, Any]
"""(episode, its env's action): one env's share of an `Episodes` step."""

Outcome = tuple[Any, float, bool, bool]
"""(observation, reward, terminated, truncated) of one env's step."""


class EnvWorkerError(RuntimeError):
    """An env's worker process failed: its exception and traceback, or that it died."""


def _serve(pipe: Connection, build: Callable[[], Any]) -> None:
    """A worker: `build()`'s object, its methods called by name ((command, args, kwargs) requests) until "close"."""
    target = None
    try:
        target = build()
        pipe.send((True, None))
        while True:
            command, args, kwargs = pipe.recv()
            if command == "close":
                break
            try:
                result = getattr(target, command)(*args, **kwargs)
            except Exception:  # the caller raises it, with this traceback
                pipe.send((False, traceback.format_exc()))
                continue
            pipe.send((True, result))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # the trainer was interrupted, or went away
        pass
    except Exception:  # building failed
        pipe.send((False, traceback.format_exc()))
    finally:
        if target is not None:
            target.close()
        pipe.close()


class Worker:
    """`build()` in a worker process of its own, its methods called by name; one call at a time.

    Making one does not wait for the build, so a pack's K workers build side by side: an evaluation's 16 LunarLander
    players of 20 episodes were made and started in 0.9-1.2 s one after another and in 0.5-0.8 s side by side (a
    2-core machine under load, 2026-12-07). The first call's answer waits for the build, and a failed build is
    raised there, with the worker's traceback."""

    def __init__(self, build: Callable[[], Any]) -> None:
        context = multiprocessing.get_context()  # the platform's default, as Gymnasium's AsyncVectorEnv uses
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, build), daemon=True)
        self.process.start()
        child.close()
        self.waiting: str | None = None  # the call sent and not yet gathered
        self.built = False  # the worker's word that its build succeeded has been read

    def call(self, command: str, *args: Any, **kwargs: Any) -> Any:
        self.call_async(command, *args, **kwargs)
        return self.wait()

    def call_async(self, command: str, *args: Any, **kwargs: Any) -> None:
        if self.waiting is not None:
            raise RuntimeError(f"{command} while {self.waiting} is under way: wait for it first")
        try:
            self.pipe.send((command, args, kwargs))
        except OSError as error:
            self._built()  # a worker whose build failed is gone: its traceback says why
            raise EnvWorkerError(f"the envs' worker process is gone ({error})") from None
        self.waiting = command

    def wait(self) -> Any:
        if self.waiting is None:
            raise RuntimeError("nothing to wait for: no call is under way")
        self.waiting = None
        self._built()
        return self._receive()

    def close(self) -> None:
        if self.process.is_alive():
            try:
                if self.waiting is not None:
                    self.wait()
                self.pipe.send(("close", (), {}))
            except (OSError, EnvWorkerError):
                pass
            self.process.join(JOIN_SECONDS)
        if self.process.is_alive():
            self.process.terminate()
        self.pipe.close()

    def _built(self) -> None:
        """Read the worker's word on its build, once: a failed build raises here."""
        if not self.built:
            self._receive()
            self.built = True

    def _receive(self) -> Any:
        try:
            ok, result = self.pipe.recv()
        except EOFError:
            raise EnvWorkerError(f"the envs' worker process died (exit code {self.process.exitcode})") from None
        if not ok:
            raise EnvWorkerError(f"the envs' worker process failed:\n{result}")
        return result


class ProcessVectorEnv(VectorEnv[Any, Any, Any]):
    """`num_envs` copies of `make()` stepped in turn in one worker process, as a `SyncVectorEnv` there."""

    def __init__(self, make: Callable[[], gym.Env[Any, Any]], num_envs: int, autoreset: AutoresetMode) -> None:
        probe = make()  # the spaces, read here rather than asked of the worker
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        self.metadata = {**probe.metadata, "autoreset_mode": autoreset}
        probe.close()
        self.num_envs = num_envs
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.worker = Worker(functools.partial(SyncVectorEnv, [make] * num_envs, autoreset_mode=autoreset))

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.worker.call("reset", seed=seed, options=options)

    def step_async(self, actions: Any) -> None:
        self.worker.call_async("step", actions)

    def step_wait(self) -> Any:
        if self.worker.waiting != "step":
            raise RuntimeError("step_wait without step_async")
        return self.worker.wait()

    def step(self, actions: Any) -> Any:
        self.step_async(actions)
        return self.step_wait()

    def close_extras(self, **kwargs: Any) -> None:
        self.worker.close()


class Episodes:
    """Greedy evaluation's envs: env e of `make()` reset with seeds[e], then stepped while its episode runs (the
    caller leaves an ended one out of its moves). `step_async` and `step_wait` as `EpisodesInWorker` has them."""

    def __init__(self, make: Callable[[], gym.Env[Any, Any]], seeds: Sequence[int]) -> None:
        self.envs = [make() for _ in seeds]
        self.seeds = list(seeds)
        self.moves: list[Move] = []

    def start(self) -> list[Any]:
        """Each env's first observation."""
        return [env.reset(seed=seed)[0] for env, seed in zip(self.envs, self.seeds, strict=True)]

    def step(self, moves: list[Move]) -> list[Outcome]:
        return [self.envs[e].step(action)[:4] for e, action in moves]  # type: ignore[misc]

    def step_async(self, moves: list[Move]) -> None:
        self.moves = moves

    def step_wait(self) -> list[Outcome]:
        return self.step(self.moves)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class EpisodesInWorker:
    """`Episodes` in a worker process of their own: a pack's runs play their evaluations in parallel."""

    def __init__(self, make: Callable[[], gym.Env[Any, Any]], seeds: Sequence[int]) -> None:
        self.worker = Worker(functools.partial(Episodes, make, list(seeds)))

    def start(self) -> list[Any]:
        return self.worker.call("start")  # type: ignore[no-any-return]

    def step_async(self, moves: list[Move]) -> None:
        self.worker.call_async("step", moves)

    def step_wait(self) -> list[Outcome]:
        return self.worker.wait()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.worker.close()
