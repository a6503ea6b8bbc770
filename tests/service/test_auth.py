"""Tokens: random, shown once, stored as sha256, bound to a tenant."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from service.auth import Principal, TokenCache, authenticate, create_token, hash_token
from service.errors import Unauthorized
from service.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'auth.db'}")
    store.migrate()
    return store


def test_tokens_authenticate_as_their_tenant_and_only_the_hash_is_stored(store: Store) -> None:
    secret, info = create_token(store, name="ci", tenant="team-a", admin=True)
    assert secret.startswith("fxh_") and len(secret) > 40
    assert authenticate(store, f"Bearer {secret}") == Principal(tenant="team-a", name="ci", admin=True)
    with store.engine.connect() as connection:
        stored = connection.exec_driver_sql("SELECT token_hash FROM tokens").scalar()
    assert stored == hashlib.sha256(secret.encode()).hexdigest() == hash_token(secret)
    assert secret not in str(info.model_dump())
    other, _ = create_token(store, name="ci", tenant="team-a")
    assert other != secret


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing bearer token"),
        ("", "missing bearer token"),
        ("Token abc", "malformed Authorization header"),
        ("Bearer ", "malformed Authorization header"),
        ("Bearer fxh_unknown", "unknown or revoked token"),
    ],
)
def test_bad_headers_are_unauthorized(store: Store, header: str | None, message: str) -> None:
    with pytest.raises(Unauthorized, match=message):
        authenticate(store, header)


def test_revoked_tokens_stop_working(store: Store) -> None:
    secret, info = create_token(store, name="ci", tenant="team-a")
    store.revoke_token(info.id)
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        authenticate(store, f"Bearer {secret}")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_cached_token_revoked_works_until_its_ttl_has_passed_and_no_longer(store: Store) -> None:
    secret, info = create_token(store, name="ci", tenant="team-a")
    clock = FakeClock()
    cache = TokenCache(store, ttl_seconds=5.0, clock=clock)
    header = f"Bearer {secret}"
    assert authenticate(cache, header).tenant == "team-a"
    store.revoke_token(info.id)
    clock.now += 4.9
    assert authenticate(cache, header).tenant == "team-a"  # the documented window: at most the TTL
    clock.now += 0.2
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        authenticate(cache, header)
    clock.now = 0.0  # a revoked token is not cached either: refused whatever the clock says
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        authenticate(cache, header)


def test_an_unknown_token_is_not_cached_and_a_zero_ttl_asks_the_store_every_time(store: Store) -> None:
    cache = TokenCache(store, ttl_seconds=60.0, clock=FakeClock())
    secret = "fxh_made_later"
    with pytest.raises(Unauthorized):
        authenticate(cache, f"Bearer {secret}")
    store.add_token(token_hash=hash_token(secret), name="late", tenant="team-b", admin=False)
    assert authenticate(cache, f"Bearer {secret}").tenant == "team-b"  # the miss was not remembered
    uncached = TokenCache(store, ttl_seconds=0.0, clock=FakeClock())
    other, info = create_token(store, name="ci", tenant="team-a")
    assert authenticate(uncached, f"Bearer {other}").tenant == "team-a"
    store.revoke_token(info.id)
    with pytest.raises(Unauthorized):
        authenticate(uncached, f"Bearer {other}")


def test_the_cache_asks_the_store_once_per_ttl_and_stays_bounded(store: Store) -> None:
    asked: list[str] = []
    find = store.find_token

    def counting(token_hash: str) -> object:
        asked.append(token_hash)
        return find(token_hash)

    store.find_token = counting  # type: ignore[method-assign]
    secret, _ = create_token(store, name="ci", tenant="team-a")
    clock = FakeClock()
    cache = TokenCache(store, ttl_seconds=5.0, clock=clock, max_entries=2)
    for _ in range(3):
        authenticate(cache, f"Bearer {secret}")
    assert len(asked) == 1
    clock.now += 5.0
    authenticate(cache, f"Bearer {secret}")
    assert len(asked) == 2
    for i in range(5):
        create_token(store, name=f"t{i}", tenant="team-a")
    others = [create_token(store, name=f"u{i}", tenant="team-a")[0] for i in range(5)]
    for other in others:
        authenticate(cache, f"Bearer {other}")
    assert len(cache._entries) <= 2


def test_empty_names_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        create_token(store, name=" ", tenant="team-a")


def test_admin_sees_every_tenant() -> None:
    assert Principal(tenant="ops", name="root", admin=True).visible_tenant is None
    assert Principal(tenant="team-a", name="alice").visible_tenant == "team-a"


@pytest.mark.parametrize(
    "tenant", ["Team A", "team_a", "-team", "team-", "a" * 64, "équipe", "team\x00a", "TEAM", "team-a\n", "\nteam-a"]
)
def test_a_tenant_name_that_is_no_dns_label_is_refused_and_no_token_is_stored(store: Store, tenant: str) -> None:
    with pytest.raises(ValueError, match="invalid tenant name"):
        create_token(store, name="ci", tenant=tenant)
    assert store.list_tokens() == []
    for good in ("team-a", "a", "0", "a" * 63):
        create_token(store, name="ci", tenant=good)


def test_token_create_on_the_command_line_says_why_a_tenant_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from service.cli import app

    monkeypatch.setenv("FOXHUNT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    refused = CliRunner().invoke(app, ["token", "create", "--tenant", "Team A", "--name", "ci"])
    assert refused.exit_code == 2
    assert "error: invalid tenant name 'Team A'" in refused.output and "e.g. team-a" in refused.output
    created = CliRunner().invoke(app, ["token", "create", "--tenant", "team-a", "--name", "ci"])
    assert created.exit_code == 0 and created.output.startswith("fxh_")


def test_a_cached_principal_comes_from_the_cache_alone_and_anything_else_is_left_to_authenticate(
    store: Store,
) -> None:
    """The API takes the caller from the cache on the event loop, and asks the store only on a miss."""
    from service.auth import cached_principal

    secret, _ = create_token(store, name="ci", tenant="team-a")
    cache = TokenCache(store, ttl_seconds=5.0, clock=FakeClock())
    header = f"Bearer {secret}"
    assert cached_principal(cache, header) is None  # not asked yet: the caller goes to authenticate
    assert authenticate(cache, header) == cached_principal(cache, header) == Principal(tenant="team-a", name="ci")
    for bad in (None, "", "Basic abc", "Bearer ", "Bearer fxh_unknown"):
        assert cached_principal(cache, bad) is None
    assert cached_principal(TokenCache(store, ttl_seconds=0.0), header) is None
