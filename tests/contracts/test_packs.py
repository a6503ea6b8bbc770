"""Which configs may share a pack: checked torch-free, by the search's suggest step and by the pack."""

from __future__ import annotations

import pytest

from contracts.packs import MAX_PACK, PackError, check_packable, packing_note
from tests.factories import tiny_config


def test_only_the_seed_and_numeric_hyper_parameters_may_differ() -> None:
    base = tiny_config()
    assert check_packable([base, tiny_config(["run.seed=3", "optim.lr=0.01", "data.epsilon_end=0.1"])]) == [
        "data.epsilon_end",
        "optim.lr",
        "run.seed",
    ]
    with pytest.raises(PackError, match="model.hidden"):
        check_packable([base, tiny_config(["model.hidden=64"])])
    with pytest.raises(PackError, match="loss.iqn_kappa"):  # checked on the host by the loss: not a per-run tensor
        check_packable([base, tiny_config(["loss.iqn_kappa=2.0"])])
    with pytest.raises(PackError, match=f"1 to {MAX_PACK}"):
        check_packable([base] * (MAX_PACK + 1))


def test_the_packing_note_names_only_the_fields_a_pack_cannot_vary() -> None:
    assert packing_note(["optim.lr", "run.seed"]) is None
    note = packing_note(["optim.lr", "model.hidden", "loss.cql"])
    assert note is not None and note.startswith("the search space varies loss.cql, model.hidden, which the runs of")
