"""The CPU-testable parts of the capture machinery: variants, precision scope, snapshots."""

from __future__ import annotations

import torch

from tests.trainer.execution.plans.test_fallback import small_setup
from trainer.algo.batch import Batch
from trainer.algo.step import Draws, Hyper, StepFlags, train_step
from trainer.execution.plans._capture import Snapshot, matmul_precision, unique_generators


def test_matmul_precision_is_scoped_and_restored() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    with matmul_precision(not before):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
        assert torch.backends.cudnn.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_matmul_precision_restores_after_an_error() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        with matmul_precision(not before):
            raise RuntimeError("capture failed")
    except RuntimeError:
        pass
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_snapshot_undoes_a_warm_up_step() -> None:
    """Capturing warms up by running real steps; the snapshot must put state, priorities and RNG back."""
    state, replay, config = small_setup()
    generator = torch.Generator().manual_seed(3)
    snapshot = Snapshot(state, replay, [generator])
    want = {name: tensor.detach().clone() for name, tensor in state.tensors().items()}
    tree = replay.sampler.tree.clone()
    first_draw = torch.rand(4, generator=torch.Generator().manual_seed(3))

    batch = Batch.empty(4, 8, 2, 2, "cpu")
    batch.obs.normal_()
    batch.next_obs.normal_()
    draws = Draws.empty(state.dims, 4, torch.device("cpu")).fill_(generator)
    output = train_step(state, batch, draws, Hyper.from_config(config), StepFlags())
    replay.update_priorities(torch.tensor([0, 1, 2, 3]), output.priority)
    assert not torch.equal(state.online, want["online"])

    snapshot.restore()
    for name, tensor in state.tensors().items():
        assert torch.equal(tensor, want[name]), name
    assert torch.equal(replay.sampler.tree, tree)
    assert torch.equal(torch.rand(4, generator=generator), first_draw)


def test_unique_generators_dedupes_by_identity() -> None:
    a, b = torch.Generator(), torch.Generator()
    assert unique_generators(a, b, a) == [a, b]
