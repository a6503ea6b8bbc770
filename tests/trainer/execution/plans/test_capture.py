"""The CPU-testable parts of the capture machinery: variants, precision scope, snapshots."""

from __future__ import annotations

import pytest
import torch

from contracts.config import build_config
from tests.trainer.execution.plans.test_fallback import SMALL, small_setup
from trainer.algo.batch import Batch
from trainer.algo.step import Draws, Hyper, StepFlags, train_step
from trainer.execution.plans._capture import Snapshot, bf16_split_k, flag_variants, matmul_precision, unique_generators


def test_flag_variants_follow_the_enabled_periodic_parts() -> None:
    assert flag_variants(build_config({}, SMALL)) == [StepFlags()]
    assert flag_variants(build_config({}, [*SMALL, "loss.vaccine=true"])) == [StepFlags(), StepFlags(vaccine=True)]
    both = flag_variants(build_config({}, [*SMALL, "loss.vaccine=true", "loss.causal=true"]))
    assert set(both) == {StepFlags(v, c) for v in (False, True) for c in (False, True)}


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


def _blas_settings() -> tuple[object, ...]:
    return torch.backends.cuda.preferred_blas_library(), torch._C._get_cublas_allow_bf16_reduced_precision_reduction()


def test_bf16_split_k_is_a_no_op_where_torch_has_no_cuda() -> None:
    """The CPU build cannot select cuBLASLt: forbidding split-K there must change nothing, not fail."""
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch")
    before = _blas_settings()
    with bf16_split_k(False):
        assert _blas_settings() == before
    assert _blas_settings() == before


@pytest.mark.gpu
def test_bf16_split_k_forbidden_selects_cublaslt_and_is_restored() -> None:
    before = _blas_settings()
    with bf16_split_k(False):
        assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
        assert torch._C._get_cublas_allow_bf16_reduced_precision_reduction() == (False, False)
        a = torch.randn(64, 8192, device="cuda", dtype=torch.bfloat16)
        reference = (a.float().T @ a.float()).bfloat16()
        assert torch.allclose(a.T @ a, reference, rtol=2e-2, atol=1.0)
    assert _blas_settings() == before


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
