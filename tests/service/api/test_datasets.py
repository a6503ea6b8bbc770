"""data.dataset through the real app: only the admin's roots and URL schemes, refused at submission (422).

Each attack of issue 29 is sent as a tenant would send it; the controller must refuse it by name and
stat alone, without reading the file or fetching the URL, and its answer must name what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from service.settings import Settings
from tests.http_files import file_server
from tests.service.conftest import Controller
from tests.service.factories import make_settings

SECRET = b"root:$6$s3cr3t-hash:19000:0:99999:7:::\n"
MAX_BYTES = 4096


def _submit(c: Controller, dataset: str, **data: Any) -> Any:
    config = {"data": {"source": "offline", "dataset": dataset, **data}, "run": {"steps": 2}}
    return c.request("POST", "/v1/jobs", json={"config": config, "pool": "cpu"})


def _refused(response: Any, why: str) -> str:
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "urn:foxhunt:problem:dataset-not-allowed", problem
    assert why in problem["detail"], problem["detail"]
    assert "s3cr3t" not in response.text and "root:$6" not in response.text
    return str(problem["detail"])


@pytest.fixture
def sets(tmp_path: Path) -> Path:
    """The allowed root, with one small file in it (the controller never parses it: only its name and size)."""
    root = tmp_path / "sets"
    root.mkdir()
    np.save(root / "good.npy", np.zeros(8))
    (root / "good.npz").write_bytes((root / "good.npy").read_bytes())
    return root


@pytest.fixture
def guarded(tmp_path: Path, sets: Path, controller_factory: Callable[[Settings], Controller]) -> Controller:
    settings = make_settings(tmp_path, run_reconciler=False, dataset_roots=[str(sets)], dataset_max_bytes=MAX_BYTES)
    return controller_factory(settings)


def test_no_dataset_is_allowed_by_default(
    tmp_path: Path, sets: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    controller = controller_factory(make_settings(tmp_path, run_reconciler=False))
    _refused(_submit(controller, str(sets / "good.npz")), "no dataset is allowed here")
    market = controller.request("POST", "/v1/jobs", json={"config": {"run": {"steps": 2}}, "pool": "cpu"})
    assert market.status_code == 201


def test_the_controllers_own_files_are_refused_naming_the_roots(guarded: Controller, sets: Path) -> None:
    detail = _refused(_submit(guarded, "/etc/shadow"), "outside the allowed places")
    assert f"datasets may come from under {sets}" in detail


def test_a_planted_file_outside_the_roots_is_refused_also_as_a_file_url_or_through_a_link(
    guarded: Controller, tmp_path: Path, sets: Path
) -> None:
    planted = tmp_path / "planted.npz"
    planted.write_bytes(SECRET)
    (sets / "link.npz").symlink_to(planted)
    for dataset in (str(planted), f"file://{planted}", f"{sets}/../planted.npz", str(sets / "link.npz")):
        _refused(_submit(guarded, dataset), "outside the allowed places")


def test_a_url_to_a_local_server_is_refused_and_never_fetched(guarded: Controller) -> None:
    with file_server({"/x.parquet": SECRET}) as server:
        _refused(_submit(guarded, f"{server.url}/x.parquet"), "is not in an allowed place")
        _refused(_submit(guarded, f"simplecache::{server.url}/x.parquet"), "chained URLs")
    assert server.requests == []


def test_dev_zero_is_refused_even_under_an_allowed_root(
    tmp_path: Path, controller_factory: Callable[[Settings], Controller]
) -> None:
    controller = controller_factory(make_settings(tmp_path, run_reconciler=False, dataset_roots=["/dev"]))
    _refused(_submit(controller, "/dev/zero"), "is not a regular file")


def test_a_file_over_the_cap_is_refused_by_its_size(guarded: Controller, sets: Path) -> None:
    (sets / "big.npz").write_bytes(b"\0" * (MAX_BYTES + 1))
    _refused(_submit(guarded, str(sets / "big.npz")), f"is {MAX_BYTES + 1} bytes, over the limit of {MAX_BYTES}")


def test_a_job_may_not_set_its_own_dataset_access(guarded: Controller, sets: Path) -> None:
    response = _submit(guarded, "/etc/shadow", dataset_access={"roots": ["/"]})
    _refused(response, "data.dataset_access is the controller's to set")


def test_an_allowed_dataset_is_stored_with_the_controllers_access_for_the_trainer(
    guarded: Controller, sets: Path
) -> None:
    for dataset in (str(sets / "good.npz"), f"file://{sets}/good.npz", str(sets / "not-there-yet.npz")):
        created = _submit(guarded, dataset)
        assert created.status_code == 201, created.text
        stored = created.json()["config"]["data"]
        assert stored["dataset"] == dataset
        assert stored["dataset_access"] == {"roots": [str(sets)], "schemes": [], "max_bytes": MAX_BYTES}


def test_bad_dataset_settings_stop_the_controller_at_start(tmp_path: Path) -> None:
    for field, value in (("dataset_roots", ["relative/sets"]), ("dataset_schemes", ["file"])):
        with pytest.raises(ValidationError, match="dataset"):
            make_settings(tmp_path, **{field: value})
