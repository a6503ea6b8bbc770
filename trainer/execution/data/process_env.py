"""A run's N envs in one worker process of their own, stepped there in turn (`data.vector_env: process`).

Gymnasium's `AsyncVectorEnv` gives each env a process: right for one run whose few envs are slow, but a pack of
K runs of N envs each then runs K x N processes (64 for LunarLander's 16 x 4, on 16 cores), and each step is K x N
process round trips. Here each run's envs live in one worker, as the `SyncVectorEnv` a sync run steps in its own
process: a pack's runs step in parallel, one process and one round trip a run and step. The worker builds its
envs with the same constructor and seeds them as `reset(seed=)` asks, so its rows are those of the sync vector env,
bit for bit (`tests/trainer/execution/data/test_process_env.py`).

`step_async` sends the actions and returns; `step_wait` gathers the step (`GymSource.start_collect` and
`finish_collect`, and the pack's `GymPackEnvs.step`, which sends every run's actions before gathering any).
An error in the worker comes back as `EnvWorkerError` with the worker's own message.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space

JOIN_SECONDS = 5.0
"""How long `close` waits for the worker to end before it is terminated."""


class EnvWorkerError(RuntimeError):
    """An env's worker process failed: its exception and traceback, or that it died."""


def _serve(pipe: Connection, make: Callable[[], gym.Env[Any, Any]], num_envs: int, autoreset: AutoresetMode) -> None:
    """The worker: `num_envs` envs as a `SyncVectorEnv`, answering (command, argument) requests until "close"."""
    envs = None
    try:
        envs = SyncVectorEnv([make] * num_envs, autoreset_mode=autoreset)
        pipe.send((True, None))
        while True:
            command, argument = pipe.recv()
            if command == "close":
                break
            try:
                result = envs.step(argument) if command == "step" else envs.reset(**argument)
            except Exception:  # the caller raises it, with this traceback
                pipe.send((False, traceback.format_exc()))
                continue
            pipe.send((True, result))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # the trainer was interrupted, or went away
        pass
    except Exception:  # building the envs failed
        pipe.send((False, traceback.format_exc()))
    finally:
        if envs is not None:
            envs.close()
        pipe.close()


class ProcessVectorEnv(VectorEnv[Any, Any, Any]):
    """`num_envs` copies of `make()` stepped in turn in one worker process (see the module docstring)."""

    def __init__(self, make: Callable[[], gym.Env[Any, Any]], num_envs: int, autoreset: AutoresetMode) -> None:
        probe = make()  # the spaces, read here rather than asked of the worker
        self.single_observation_space, self.single_action_space = probe.observation_space, probe.action_space
        self.metadata = {**probe.metadata, "autoreset_mode": autoreset}
        probe.close()
        self.num_envs = num_envs
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        context = multiprocessing.get_context()  # the platform's default, as Gymnasium's AsyncVectorEnv uses
        self._pipe, child = context.Pipe()
        self._worker = context.Process(target=_serve, args=(child, make, num_envs, autoreset), daemon=True)
        self._worker.start()
        child.close()
        self._waiting = False
        self._receive()  # the envs are built, or their error raised here

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None) -> Any:
        self._send("reset", {"seed": seed, "options": options})
        return self._receive()

    def step_async(self, actions: Any) -> None:
        self._send("step", actions)
        self._waiting = True

    def step_wait(self) -> Any:
        if not self._waiting:
            raise RuntimeError("step_wait without step_async")
        self._waiting = False
        return self._receive()

    def step(self, actions: Any) -> Any:
        self.step_async(actions)
        return self.step_wait()

    def close_extras(self, **kwargs: Any) -> None:
        if self._worker.is_alive():
            try:
                if self._waiting:
                    self._receive()
                self._pipe.send(("close", None))
            except (OSError, EnvWorkerError):
                pass
            self._worker.join(JOIN_SECONDS)
        if self._worker.is_alive():
            self._worker.terminate()
        self._pipe.close()

    def _send(self, command: str, argument: Any) -> None:
        if self._waiting:
            raise RuntimeError(f"{command} while a step is under way: call step_wait first")
        try:
            self._pipe.send((command, argument))
        except OSError as error:
            raise EnvWorkerError(f"the envs' worker process is gone ({error})") from None

    def _receive(self) -> Any:
        try:
            ok, result = self._pipe.recv()
        except EOFError:
            raise EnvWorkerError(f"the envs' worker process died (exit code {self._worker.exitcode})") from None
        if not ok:
            raise EnvWorkerError(f"the envs' worker process failed:\n{result}")
        return result
