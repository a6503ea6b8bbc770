"""CUDA graph capture as the CPU can emulate it: what a captured plan freezes, without a GPU.

A CUDA graph replays the kernels its capture launched, on the tensors they were launched on, with the scalars they
were given: nothing of the Python that launched them runs again. `capture` here runs the body's warm-up as the
real one does, then runs the body once under a recorder of every aten op (and of every keyed-draw kernel, which
Triton's interpreter runs outside aten); a replay re-runs the recorded ops on the recorded tensors and writes each
result into the tensor the capture produced. A plan that works only because its Python runs at every step (a host
value read once, a tensor rebound instead of written in place) then parts from its eager form, here in CI. What it
cannot show is the GPU's own part: streams, the allocator, a real launch under capture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

Recorded = tuple[Any, tuple[Any, ...], dict[str, Any], Any] | Callable[[], Any]
"""An aten op (op, args, kwargs, what it returned) or a kernel launch to repeat."""


class Recorder(TorchDispatchMode):
    """Runs every aten op and keeps it, with its arguments and outputs, for the replays."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[Recorded] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in ("_local_scalar_dense", "is_nonzero"):
            raise RuntimeError(f"{func} reads a device value on the host: a capture cannot")
        out = func(*args, **kwargs)
        self.recorded.append((func, args, kwargs, out))
        return out


class EmulatedGraph:
    """The recorded ops; `replay` runs them again, as a `torch.cuda.CUDAGraph` replays its kernels."""

    def __init__(self, recorded: list[Recorded]) -> None:
        self.recorded = recorded

    def replay(self) -> None:
        with torch.no_grad():
            for entry in self.recorded:
                if callable(entry):
                    entry()
                    continue
                func, args, kwargs, out = entry
                result = func(*args, **kwargs)
                if func.overloadpacket.__name__.startswith("empty"):
                    continue  # a graph's fresh buffer holds whatever its last replay left
                for got, captured in zip(tree_flatten(result)[0], tree_flatten(out)[0], strict=True):
                    tensors = isinstance(captured, torch.Tensor) and isinstance(got, torch.Tensor)
                    if tensors and got.untyped_storage().data_ptr() != captured.untyped_storage().data_ptr():
                        captured.copy_(got)  # else written in place, or a view of the same storage


class CaptureEmulator:
    """`trainer.execution.plans._capture.capture`'s stand-in (warm-up, then one recorded call)."""

    graph_type = EmulatedGraph

    def __init__(self) -> None:
        self.recording: list[Recorder] = []

    def capture(
        self,
        body: Callable[[], Any],
        pool: Any,
        stream: Any,
        generators: Sequence[torch.Generator] = (),
        warmup: int = 3,
    ) -> tuple[EmulatedGraph, Any]:
        for _ in range(warmup):
            body()
        recorder = Recorder()
        self.recording.append(recorder)
        with recorder:
            out = body()
        self.recording.pop()
        return EmulatedGraph(recorder.recorded), out

    def keyed_kernel(self, out: torch.Tensor, *args: Any) -> torch.Tensor:
        """`trainer.algo.rng.keyed_draw_` through the Triton kernel (the interpreter), recorded as one launch."""
        from trainer.execution.kernels.keyed import keyed_draw_kernel_

        def launch() -> torch.Tensor:
            return keyed_draw_kernel_(out, *args)

        if not self.recording:
            return launch()
        with _disable_current_modes():  # the interpreter's own tensor traffic is not the kernel's work
            launch()
        self.recording[-1].recorded.append(launch)
        return out


@pytest.fixture
def emulated_capture(monkeypatch: pytest.MonkeyPatch) -> CaptureEmulator:
    """The graph plans (`make_plan`'s too) and packs build and replay on the CPU, their captures emulated; keyed
    draws go through the Triton kernel as on a GPU."""
    from trainer.algo import rng
    from trainer.execution import pack, plans
    from trainer.execution.plans import _capture, base, graph

    emulator = CaptureEmulator()
    for module in (_capture, graph, pack):
        monkeypatch.setattr(module, "capture", emulator.capture, raising=False)
    for module in (base, pack):
        monkeypatch.setattr(module, "require_cuda", lambda *args: None)
    monkeypatch.setattr(plans, "resolve_plan", lambda name, device: name)  # `make_plan("graph")` builds one here
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(rng, "keyed_draw_", emulator.keyed_kernel)
    return emulator
