"""A checkpoint's flat parameter tensors only mean something under the layout that wrote them."""

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from tests.factories import tiny_config
from trainer.algo.model import ALIGN, ModelDims, round_up
from trainer.algo.state import TrainState
from trainer.runtime.checkpoint import CheckpointError
from trainer.runtime.train import run_training


def tiny_state() -> TrainState:
    config = tiny_config()
    dims = ModelDims.build(config.model, obs_dim=8, branches=2, actions=3)
    return TrainState.create(config, dims, "cpu")


def test_the_layout_record_names_every_parameter_in_memory_order() -> None:
    state = tiny_state()
    record = state.layout_record()
    assert set(record) == {"main", "iql", "attn"}
    main = record["main"]
    assert main[0][1] == 0 and main[-1][2] == state.main.size
    # in order, no overlap, each gap only the padding to the next multiple of ALIGN
    assert all(later[1] in (earlier[2], round_up(earlier[2])) for earlier, later in itertools.pairwise(main))
    assert all(math.prod(shape) == end - start for _, start, end, *shape in main)  # the stored (padded) shape
    value2 = next(entry for entry in main if entry[0] == "value2_w")
    assert value2[3:] == [round_up(state.dims.atoms), state.dims.head_hidden] and value2[1] % ALIGN == 0
    state.check_layout(json.loads(json.dumps(record)))  # survives the JSON of meta.json


def test_a_checkpoint_laid_out_otherwise_is_refused_naming_the_first_difference() -> None:
    state = tiny_state()
    record = json.loads(json.dumps(state.layout_record()))
    first, second = record["main"][0], record["main"][1]
    record["main"][0] = [second[0], first[1], first[1] + second[2] - second[1], *second[3:]]  # other order
    with pytest.raises(CheckpointError, match=f"main parameters are laid out differently .*{second[0]} at 0:"):
        state.check_layout(record)
    padded = json.loads(json.dumps(state.layout_record()))
    entry = next(entry for entry in padded["main"] if entry[0] == "adv2_w")
    entry[3:] = [entry[3] - 1, entry[4]]  # the same offsets, unpadded rows: a layout of its own
    with pytest.raises(CheckpointError, match="adv2_w at .* there"):
        state.check_layout(padded)
    with pytest.raises(CheckpointError, match="no parameter layout record"):
        state.check_layout(None)


def test_resuming_a_checkpoint_without_a_layout_record_fails_instead_of_scrambling_weights(tmp_path: Path) -> None:
    config = tiny_config(["run.steps=10", "run.eval_episodes=0"])
    run_training(config, tmp_path, show_progress=False, out=lambda _: None)
    (meta_path,) = tmp_path.glob("checkpoints/step-*/meta.json")
    meta = json.loads(meta_path.read_text())
    assert "param_layout" in meta
    del meta["param_layout"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="resume it with the code that wrote it"):
        run_training(tiny_config(["run.steps=20"]), tmp_path, resume=True, show_progress=False, out=lambda _: None)


def test_a_checkpoint_with_the_old_left_vector_resumes_with_a_fresh_right_vector() -> None:
    """Before 2026-12-05 spectral norm carried u [ΣR]; the state now carries v [ΣC]. Every other tensor loads."""
    written, resumed = tiny_state(), tiny_state()
    with torch.no_grad():
        written.online.add_(1.0)
    tensors = {name: tensor for name, tensor in written.tensors().items() if name != "spectral_v"}
    tensors["spectral_u"] = torch.ones(sum(spec.shape[0] for spec in written.main.matrices()))
    fresh = resumed.spectral_v.clone()
    resumed.load_tensors(tensors)
    assert torch.equal(resumed.online, written.online)
    assert torch.equal(resumed.spectral_v, fresh)
    with pytest.raises(ValueError, match="lacks state tensors: spectral_v"):
        resumed.load_tensors({name: t for name, t in tensors.items() if name != "spectral_u"})
