"""`service.backends.spawn`: a start that fails for a passing reason is tried again; a bad command fails at once."""

from __future__ import annotations

import errno
import subprocess
import sys
from typing import Any
from unittest import mock

import pytest

from service.backends import spawn as spawn_module
from service.backends.spawn import TRIES, spawn
from tests.service.factories import faulting_popen


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn_module, "BACKOFF_S", 0.0)


def test_a_start_that_faults_under_load_is_tried_again_and_runs() -> None:
    calls, popen = faulting_popen([errno.EFAULT, errno.EAGAIN])
    with mock.patch.object(subprocess, "Popen", popen):
        child = spawn([sys.executable, "-c", "print('started')"], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=60)
    assert out == "started\n" and child.returncode == 0
    assert len(calls) == 3


def test_a_start_that_keeps_faulting_raises_after_its_tries() -> None:
    calls, popen = faulting_popen([errno.EFAULT] * TRIES)
    with mock.patch.object(subprocess, "Popen", popen), pytest.raises(OSError) as raised:
        spawn([sys.executable, "-c", "pass"])
    assert raised.value.errno == errno.EFAULT and len(calls) == TRIES


@pytest.mark.parametrize("code", [errno.ENOENT, errno.EACCES])
def test_a_command_that_cannot_run_fails_at_once(code: int) -> None:
    calls, popen = faulting_popen([code])
    with mock.patch.object(subprocess, "Popen", popen), pytest.raises(OSError) as raised:
        spawn([sys.executable, "-c", "pass"])
    assert raised.value.errno == code and len(calls) == 1


def test_a_missing_program_is_not_retried(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "no-such-program")])
