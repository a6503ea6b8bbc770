"""Checkpoints: safetensors tensors + JSON metadata, to a local path or any fsspec URL.

A checkpoint is a folder `step-000001000/` holding `state.safetensors` (parameters, optimiser
moments, counters), `replay.safetensors` (storage and sampler), `meta.json` (step, RNG states,
config) and, written last, `COMPLETE`. Each file is written under a temporary name and renamed, and
a folder without `COMPLETE` is ignored, so a crash at any moment leaves the last complete checkpoint
usable. The newest `keep` checkpoints are kept.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

COMPLETE = "COMPLETE"


class CheckpointError(ValueError):
    """A checkpoint this code cannot resume from (said in one line: what differs and what to do)."""


@dataclass
class Checkpoint:
    step: int
    state: dict[str, torch.Tensor]
    replay: dict[str, torch.Tensor]
    meta: dict[str, Any]


def encode_generator(generator: torch.Generator) -> str:
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode()


def decode_generator(generator: torch.Generator, encoded: str) -> None:
    raw = bytearray(base64.b64decode(encoded))
    generator.set_state(torch.frombuffer(raw, dtype=torch.uint8).clone())


class Checkpointer:
    def __init__(self, url: str, keep: int = 2) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.url = url
        self.keep = keep

    def _folder(self, step: int) -> str:
        return f"{self.root}/step-{step:09d}"

    def _write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp"
        with self.fs.open(tmp, "wb") as handle:
            handle.write(data)
        self.fs.mv(tmp, path)

    def save(self, checkpoint: Checkpoint) -> str:
        folder = self._folder(checkpoint.step)
        self.fs.makedirs(folder, exist_ok=True)
        cpu = {name: tensor.detach().contiguous().cpu() for name, tensor in checkpoint.state.items()}
        self._write(f"{folder}/state.safetensors", save_safetensors(cpu))
        replay = {name: tensor.detach().contiguous().cpu() for name, tensor in checkpoint.replay.items()}
        self._write(f"{folder}/replay.safetensors", save_safetensors(replay))
        self._write(f"{folder}/meta.json", json.dumps({"step": checkpoint.step, **checkpoint.meta}).encode())
        self._write(f"{folder}/{COMPLETE}", b"")
        self._prune()
        return folder

    def complete_steps(self) -> list[int]:
        if not self.fs.exists(self.root):
            return []
        steps = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith("step-") and self.fs.exists(f"{entry}/{COMPLETE}"):
                steps.append(int(name.removeprefix("step-")))
        return sorted(steps)

    def load_latest(self) -> Checkpoint | None:
        steps = self.complete_steps()
        return self.load(steps[-1]) if steps else None

    def load(self, step: int) -> Checkpoint:
        """The complete checkpoint of `step` (one of `complete_steps()`)."""
        folder = self._folder(step)
        with self.fs.open(f"{folder}/state.safetensors", "rb") as handle:
            state = load_safetensors(handle.read())
        with self.fs.open(f"{folder}/replay.safetensors", "rb") as handle:
            replay = load_safetensors(handle.read())
        with self.fs.open(f"{folder}/meta.json", "rb") as handle:
            meta = json.loads(handle.read())
        return Checkpoint(step=meta["step"], state=state, replay=replay, meta=meta)

    def meta(self, step: int) -> dict[str, Any]:
        """The metadata of `step`'s complete checkpoint, without reading its tensors."""
        with self.fs.open(f"{self._folder(step)}/meta.json", "rb") as handle:
            return json.loads(handle.read())  # type: ignore[no-any-return]

    def _prune(self) -> None:
        for step in self.complete_steps()[: -self.keep]:
            self.fs.rm(self._folder(step), recursive=True)
