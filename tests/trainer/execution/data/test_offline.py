"""Offline datasets: round trips, one-line errors for malformed files, collection order."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from contracts.config import build_config
from contracts.datasets import DatasetAccess
from tests.http_files import file_server
from trainer.algo.replay.buffer import ReplayBuffer
from trainer.execution.data.gym_source import GymSource
from trainer.execution.data.offline import DatasetError, OfflineSource, collect_dataset, load_dataset, write_dataset

from .conftest import MULTI_ID, PLANTED_MODULE


def columns(n: int = 12, f: int = 3, k: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    step = np.arange(n) % 4
    return {
        "obs": rng.normal(size=(n, f)).astype(np.float32),
        "action": rng.integers(0, 5, (n, k)),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, f)).astype(np.float32),
        "done": (step == 3).astype(np.float32),
        "episode_step": step,
    }


@pytest.mark.parametrize("suffix", [".parquet", ".npz"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    path = str(tmp_path / f"data{suffix}")
    arrays = columns()
    write_dataset(path, arrays, num_actions=5)
    dataset = load_dataset(path)
    assert dataset.metadata["num_actions"] == 5 and len(dataset) == 12
    for name, value in arrays.items():
        np.testing.assert_array_equal(dataset.arrays[name], value)
    source = OfflineSource(path, "cpu")
    assert (source.spec.obs_dim, source.spec.branches, source.spec.actions) == (3, 2, 5)
    rows = source.transitions()
    assert rows.action.shape == (12, 2) and torch.equal(rows.last, torch.from_numpy(arrays["done"] == 1))
    with pytest.raises(DatasetError, match="cannot evaluate: its metadata names no env_id"):
        source.evaluate(lambda obs: obs, 1, 0)


def test_fsspec_url_and_single_branch_actions() -> None:
    arrays = columns(k=1)
    arrays["action"] = arrays["action"][:, 0]  # [N] for K = 1
    write_dataset("memory://datasets/one.npz", arrays, num_actions=5)
    dataset = load_dataset("memory://datasets/one.npz")
    assert dataset.arrays["action"].shape == (12, 1)


def npz_bytes(arrays: dict[str, np.ndarray], meta: str = '{"num_actions": 5}') -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, foxhunt=np.array(meta))
    return buffer.getvalue()


def edit(**changes: object) -> Callable[[dict[str, np.ndarray]], None]:
    def apply(arrays: dict[str, np.ndarray]) -> None:
        for name, value in changes.items():
            if value is None:
                del arrays[name]
            else:
                arrays[name] = value(arrays[name]) if callable(value) else value  # type: ignore[assignment]

    return apply


MALFORMED = [
    (edit(reward=None), "missing column 'reward'"),
    (edit(next_obs=lambda a: a[:, :2]), r"next_obs has shape \[12, 2\] but obs has \[12, 3\]"),
    (edit(reward=lambda a: a[:, None]), r"column 'reward' has shape \[12, 1\], expected \[N\] with N = 12"),
    (edit(done=lambda a: a[:5]), r"column 'done' has shape \[5\], expected \[N\] with N = 12"),
    (edit(obs=lambda a: a.astype(np.int64)), "column 'obs' has dtype int64, expected float"),
    (edit(action=lambda a: a.astype(np.float32)), "column 'action' has dtype float32, expected integer"),
    (edit(reward=lambda a: np.where(np.arange(12) == 3, np.nan, a)), "column 'reward' contains NaN or inf"),
    (edit(action=lambda a: a + 3), r"action values must be in \[0, 5\), found 3..7"),
    (edit(done=lambda a: a * 2), "column 'done' must hold only 0/1"),
    (edit(episode_step=lambda a: a - 1), "column 'episode_step' has negative values"),
    (edit(obs=lambda a: a[:0], next_obs=lambda a: a[:0]), "has no rows"),
]


@pytest.mark.parametrize(("change", "message"), MALFORMED)
@pytest.mark.parametrize("suffix", [".npz", ".parquet"])
def test_malformed_files_give_one_line_errors(
    tmp_path: Path, suffix: str, change: Callable[[dict[str, np.ndarray]], None], message: str
) -> None:
    arrays = columns()
    change(arrays)
    path = tmp_path / f"bad{suffix}"
    if suffix == ".npz":
        path.write_bytes(npz_bytes(arrays))
    elif len({len(v) for v in arrays.values()}) > 1:
        pytest.skip("a Parquet table cannot hold columns of different lengths")
    else:
        fields = {
            name: pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]) if v.ndim == 2 else pa.array(v)
            for name, v in arrays.items()
        }
        pq.write_table(pa.table(fields).replace_schema_metadata({"foxhunt": '{"num_actions": 5}'}), path)
    with pytest.raises(DatasetError, match=message) as error:
        load_dataset(str(path))
    assert "\n" not in str(error.value) and str(error.value).startswith(f"dataset {path}: ")
    with pytest.raises(DatasetError, match=message):  # the writer validates the same way
        write_dataset(str(tmp_path / f"out{suffix}"), arrays, num_actions=5)


def test_unreadable_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.parquet"
    text.write_text("obs,action\n1,2\n")
    with pytest.raises(DatasetError, match=r"not a Parquet or .npz file \(neither format's signature at its start\)"):
        load_dataset(str(text))
    with pytest.raises(DatasetError, match="file not found"):
        load_dataset(str(tmp_path / "missing.npz"))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1" + b"\0" * 20)
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_dataset(str(broken))
    no_meta = tmp_path / "no_meta.npz"
    no_meta.write_bytes(npz_bytes(columns(), meta="[1]"))
    with pytest.raises(DatasetError, match="must be a JSON object"):
        load_dataset(str(no_meta))
    buffer = io.BytesIO()
    np.savez(buffer, **columns())
    (tmp_path / "bare.npz").write_bytes(buffer.getvalue())
    with pytest.raises(DatasetError, match="must give num_actions or env_id"):
        load_dataset(str(tmp_path / "bare.npz"))
    ragged = pa.table(
        {
            "obs": pa.array([[1.0, 2.0], [1.0]]),
            "action": pa.array([0, 1]),
            "reward": pa.array([0.0, 0.0]),
            "next_obs": pa.array([[1.0, 2.0], [1.0, 2.0]]),
            "done": pa.array([False, True]),
        }
    ).replace_schema_metadata({"foxhunt": '{"num_actions": 2}'})
    pq.write_table(ragged, tmp_path / "ragged.parquet")
    with pytest.raises(DatasetError, match="column 'obs' has rows of different lengths"):
        load_dataset(str(tmp_path / "ragged.parquet"))
    with pytest.raises(DatasetError, match="unknown format"):
        write_dataset(str(tmp_path / "data.csv"), columns(), num_actions=5)


def test_collected_dataset_keeps_episodes_contiguous_and_loads_into_replay(tmp_path: Path) -> None:
    source = GymSource(MULTI_ID, 3, 0, "cpu")
    arrays = collect_dataset(source, 20, None, 1.0, torch.Generator().manual_seed(0))
    assert len(arrays["obs"]) == 60
    step, done = arrays["episode_step"], arrays["done"]
    restart = np.flatnonzero(step[1:] != step[:-1] + 1) + 1
    assert (step[restart] == 0).all() and step[0] == 0  # every episode is contiguous, from its step 0
    np.testing.assert_array_equal(arrays["next_obs"][:, 0], step + 1)  # t of the env, per episode
    assert done.sum() > 0

    path = str(tmp_path / "toy.parquet")
    write_dataset(path, arrays, num_actions=3, env_id=MULTI_ID)
    offline = OfflineSource(path, "cpu")
    assert (offline.spec.obs_dim, offline.spec.branches, offline.spec.actions) == (2, 2, 3)
    config = build_config({"replay": {"capacity": 128}, "run": {"batch_size": 16}, "data": {"num_envs": 3}})
    buffer = ReplayBuffer(config, offline.spec, "cpu", torch.Generator().manual_seed(0))
    buffer.extend(offline.transitions())
    assert len(buffer) == 60
    np.testing.assert_array_equal(buffer.storage.episode_step[:60].numpy(), step)
    assert offline.evaluate(lambda obs: torch.full((obs.shape[0], 2), 2), 2, seed=0) == [4.0, 4.0]


def test_env_metadata_must_match_the_arrays(tmp_path: Path) -> None:
    path = str(tmp_path / "wrong.npz")
    write_dataset(path, columns(), num_actions=5, env_id=MULTI_ID)  # obs width 3, env has 2
    with pytest.raises(DatasetError, match=r"widths \(3, 2\) do not match env foxhunt-test/MultiToy-v0 \(2, 2\)"):
        OfflineSource(path, "cpu")


# --- what a job may read: the controller's DatasetAccess (data.dataset_access), and no file's bytes in errors

SECRET = b"root:$6$s3cr3t-hash:19000:0:99999:7:::\n"


def _access(*roots: str | Path, schemes: tuple[str, ...] = (), max_bytes: int = 1 << 20) -> DatasetAccess:
    return DatasetAccess(roots=tuple(str(r) for r in roots), schemes=schemes, max_bytes=max_bytes)


@pytest.fixture
def sets(tmp_path: Path) -> Path:
    """An allowed root holding one good dataset, good.npz; tmp_path itself (outside it) is not allowed."""
    root = tmp_path / "sets"
    root.mkdir()
    write_dataset(str(root / "good.npz"), columns(), num_actions=5)
    return root


def test_a_file_that_is_no_dataset_is_never_quoted(tmp_path: Path) -> None:
    planted = tmp_path / "shadow.parquet"
    planted.write_bytes(SECRET)
    with pytest.raises(DatasetError) as error:
        load_dataset(str(planted))
    assert (
        str(error.value) == f"dataset {planted}: not a Parquet or .npz file (neither format's signature at its start)"
    )


def test_a_broken_npz_member_is_not_quoted(tmp_path: Path) -> None:
    """numpy's own message quotes the header it could not parse: the loader names the error type only."""
    header = b"{'descr': 'root:s3cr3t', 'fortran_order': False, 'shape': (12,), }"
    header += b" " * (63 - len(header) % 64) + b"\n"
    member = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("obs.npy", member)
    path = tmp_path / "broken.npz"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(DatasetError, match=r"not a readable .npz file \(ValueError\)") as error:
        load_dataset(str(path))
    assert "s3cr3t" not in str(error.value)


def test_paths_outside_the_roots_are_refused_naming_the_roots(tmp_path: Path, sets: Path) -> None:
    planted = tmp_path / "planted.npz"
    write_dataset(str(planted), columns(), num_actions=5)
    (sets / "link.npz").symlink_to(planted)
    escapes = ["/etc/shadow", str(planted), f"file://{planted}", f"{sets}/../planted.npz", str(sets / "link.npz")]
    for dataset in escapes:
        with pytest.raises(DatasetError, match="outside the allowed places") as error:
            load_dataset(dataset, _access(sets))
        assert f"datasets may come from under {sets}" in str(error.value), dataset
    for dataset in ("relative/good.npz", f"simplecache::file://{sets}/good.npz"):
        with pytest.raises(DatasetError, match="absolute path|chained URLs"):
            load_dataset(dataset, _access(sets))
    with pytest.raises(DatasetError, match="no dataset is allowed here"):
        load_dataset(str(sets / "good.npz"), DatasetAccess())


def test_files_inside_the_roots_load_as_a_path_a_file_url_and_through_a_linked_root(tmp_path: Path, sets: Path) -> None:
    assert len(load_dataset(str(sets / "good.npz"), _access(sets))) == 12
    assert len(load_dataset(f"file://{sets}/good.npz", _access(sets))) == 12
    linked_root = tmp_path / "linked"
    linked_root.symlink_to(sets)
    assert len(load_dataset(str(linked_root / "good.npz"), _access(linked_root))) == 12
    source = OfflineSource(str(sets / "good.npz"), "cpu", _access(sets))
    assert source.spec.actions == 5


def test_special_files_are_refused_unopened(sets: Path) -> None:
    """/dev/zero would be read whole (the loader reads a dataset at once); a FIFO would block the open."""
    fifo = sets / "fifo.npz"
    os.mkfifo(fifo)
    for dataset, access in (("/dev/zero", _access("/dev")), ("/dev/zero", None), (str(fifo), _access(sets))):
        with pytest.raises(DatasetError, match="is not a regular file"):
            load_dataset(dataset, access)
    with pytest.raises(DatasetError, match="is not a regular file"):
        load_dataset(str(sets), _access(sets))  # a directory


def test_a_file_over_the_cap_is_refused_by_its_size_before_it_is_read(sets: Path) -> None:
    size = (sets / "good.npz").stat().st_size
    with pytest.raises(DatasetError, match=f"is {size} bytes, over the limit of {size - 1}$"):
        load_dataset(str(sets / "good.npz"), _access(sets, max_bytes=size - 1))
    assert len(load_dataset(str(sets / "good.npz"), _access(sets, max_bytes=size))) == 12


@pytest.mark.skipif(not Path("/proc/self/environ").is_file(), reason="needs Linux /proc")
def test_the_read_stops_at_the_cap_when_stat_understates_the_size() -> None:
    """/proc files are regular files whose stat says 0 bytes: the reader itself must stop at the cap."""
    with pytest.raises(DatasetError, match="over the limit of 16 bytes") as error:
        load_dataset("/proc/self/environ", _access("/proc", max_bytes=16))
    assert "PATH" not in str(error.value) and "=" not in str(error.value)


def test_a_url_is_fetched_only_when_its_scheme_or_prefix_is_allowed(sets: Path) -> None:
    payload = (sets / "good.npz").read_bytes()
    with file_server({"/x.npz": payload, "/sub/y.npz": payload}) as server:
        url = f"{server.url}/x.npz"
        for access in (_access(sets), _access(f"{server.url}/sub/"), _access(schemes=("s3",))):
            with pytest.raises(DatasetError, match="is not in an allowed place"):
                load_dataset(url, access)
        with pytest.raises(DatasetError, match="is not in an allowed place"):
            load_dataset(f"{server.url}/sub/../x.npz", _access(f"{server.url}/sub/"))
        assert server.requests == []  # refused by name: nothing was fetched
        assert len(load_dataset(url, _access(schemes=("http",)))) == 12
        assert len(load_dataset(f"{server.url}/sub/y.npz", _access(f"{server.url}/sub/"))) == 12


def test_a_url_over_the_cap_is_refused_from_its_head_without_a_get(sets: Path) -> None:
    payload = (sets / "good.npz").read_bytes()
    with file_server({"/x.npz": payload}) as server:
        with pytest.raises(DatasetError, match=f"is {len(payload)} bytes, over the limit of {len(payload) - 1}$"):
            load_dataset(f"{server.url}/x.npz", _access(schemes=("http",), max_bytes=len(payload) - 1))
        assert [method for method, _ in server.requests] == ["HEAD"]


@pytest.mark.parametrize(
    ("env_id", "problem"),
    [
        (f"{PLANTED_MODULE}:Env", "metadata env_id is module-qualified (module:Name): Gymnasium would import"),
        ("CartPole v1", "metadata env_id is not a registered Gymnasium id"),
        ({"id": "CartPole-v1"}, "metadata env_id must be a Gymnasium id (a string), got dict"),
    ],
    ids=["module-qualified", "not-an-id", "not-a-string"],
)
def test_a_metadata_env_id_gymnasium_may_not_have_is_refused_before_it_is_used(
    tmp_path: Path, planted: Path, env_id: object, problem: str
) -> None:
    """The file's env_id goes to gymnasium.make for its spec and evaluation: a `module:Name` id would import
    that module in the trainer (issue 29). Refused as the file is loaded, the id itself not quoted."""
    path = tmp_path / "data.npz"
    path.write_bytes(npz_bytes(columns(), json.dumps({"num_actions": 5, "env_id": env_id})))
    for load in (lambda: load_dataset(str(path)), lambda: OfflineSource(str(path), "cpu")):
        with pytest.raises(DatasetError) as error:
            load()
        assert str(error.value).startswith(f"dataset {path}: {problem}"), error.value
        assert PLANTED_MODULE not in str(error.value)
    assert not planted.exists()
