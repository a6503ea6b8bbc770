"""Attempt-scoped progress tokens (service/progress.py): each names one attempt of one job, nothing else."""

from __future__ import annotations

import pytest

from service.progress import progress_token, token_attempt

SECRET = "progress-secret-of-the-token-tests-0123456789"


def test_a_token_names_its_attempt_and_every_attempt_has_its_own() -> None:
    tokens = [progress_token(SECRET, "job-1", attempt) for attempt in range(3)]
    assert len(set(tokens)) == 3 and tokens[0].startswith("0.") and tokens[2].startswith("2.")
    assert [token_attempt(SECRET, "job-1", token) for token in tokens] == [0, 1, 2]
    assert progress_token(SECRET, "job-1") == tokens[0]  # the first run is attempt 0


@pytest.mark.parametrize(
    "token",
    [
        progress_token(SECRET, "job-2", 0),  # another job's
        progress_token("y" * 40, "job-1", 0),  # another secret's
        "1." + progress_token(SECRET, "job-1", 0).partition(".")[2],  # attempt 0's digest relabelled
        progress_token(SECRET, "job-1", 0).partition(".")[2],  # no attempt
        "",
        ".",
        "-1." + "0" * 64,
        "+1." + progress_token(SECRET, "job-1", 1).partition(".")[2],
        "\u0661." + progress_token(SECRET, "job-1", 1).partition(".")[2],  # an Arabic-Indic digit one
        "1" * 11 + "." + "0" * 64,
    ],
)
def test_anything_else_is_no_token_of_the_job(token: str) -> None:
    assert token_attempt(SECRET, "job-1", token) is None
