"""tests/polling.py and tests/ports.py: the helpers every waiting or serving test relies on."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.ports import free_port


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    assert wait_until(lambda: next(calls) >= 3 and "ready", timeout=10, interval=0) == "ready"
    assert next(calls) == 4  # called until it was true, and no more


def test_wait_until_treats_ignored_errors_as_not_yet() -> None:
    calls = itertools.count()

    def check() -> int:
        if (n := next(calls)) < 2:
            raise ConnectionRefusedError
        return n

    assert wait_until(check, timeout=10, interval=0, ignore=(OSError,)) == 2


def test_wait_until_lets_other_errors_end_the_wait_at_once() -> None:
    calls = itertools.count()

    def check() -> bool:
        next(calls)
        raise RuntimeError("the server died")

    with pytest.raises(RuntimeError, match="died"):
        wait_until(check, timeout=10, interval=0, ignore=(OSError,))
    assert next(calls) == 1


def test_wait_until_fails_naming_what_it_waited_for_and_the_last_value() -> None:
    calls = itertools.count()
    with pytest.raises(AssertionError, match=r"waiting for the job \(last: \[\]\)"):
        wait_until(lambda: [] if next(calls) < 100 else [1], timeout=0, what="the job")
    assert next(calls) == 1  # a zero timeout still checks once


def test_free_port_never_hands_out_the_same_port_twice_in_a_run(tmp_path: Path) -> None:
    ledger = tmp_path / "ports"
    ports = [free_port(ledger) for _ in range(50)]
    assert len(set(ports)) == 50
    assert sorted(map(int, ledger.read_text().split())) == sorted(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # and the port really is free


def test_free_port_skips_a_port_already_handed_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers probing at once can be offered one port; the second is given the next one offered."""
    offered = iter([40001, 40001, 40002])
    monkeypatch.setattr("tests.ports._probe", lambda: next(offered))
    assert [free_port(tmp_path / "ports"), free_port(tmp_path / "ports")] == [40001, 40002]
