"""GPU-resident prioritised replay: storage + sampler + writer (+ HER), composed in `ReplayBuffer`."""

from trainer.replay.buffer import ReplayBuffer
from trainer.replay.her import HindsightRelabeler
from trainer.replay.sampler import PrioritizedSampler, Sampler
from trainer.replay.storage import Storage, TensorStorage
from trainer.replay.writer import DeviceRingWriter, RingWriter, Writer

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
