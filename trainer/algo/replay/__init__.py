"""GPU-resident prioritised replay: storage + sampler + writer (+ HER), composed in `ReplayBuffer`."""

from trainer.algo.replay.buffer import ReplayBuffer
from trainer.algo.replay.her import HindsightRelabeler
from trainer.algo.replay.sampler import PrioritizedSampler, Sampler
from trainer.algo.replay.storage import Storage, TensorStorage
from trainer.algo.replay.writer import DeviceRingWriter, RingWriter, Writer

__all__ = [
    "DeviceRingWriter",
    "HindsightRelabeler",
    "PrioritizedSampler",
    "ReplayBuffer",
    "RingWriter",
    "Sampler",
    "Storage",
    "TensorStorage",
    "Writer",
]
