"""Bearer tokens: high-entropy secrets shown once, stored as sha256, each bound to a tenant."""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from service.errors import Unauthorized
from service.store import Store, TokenInfo

TOKEN_PREFIX = "fxh_"
TENANT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # whole name: fullmatch (`$` passes "a\n")
"""A tenant name is a DNS label (RFC 1123): it becomes a Kubernetes label value and part of object names."""


class Principal(BaseModel):
    """Who is calling: the tenant whose jobs they see, and whether they see everyone's."""

    tenant: str
    name: str
    admin: bool = False

    @property
    def visible_tenant(self) -> str | None:
        """The tenant filter for queries: None for an admin (sees all)."""
        return None if self.admin else self.tenant


def hash_token(secret: str) -> str:
    """sha256 is enough for 256-bit random secrets (no dictionary to attack)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(store: Store, *, name: str, tenant: str, admin: bool = False) -> tuple[str, TokenInfo]:
    """A new token: (secret, stored info). The secret is not kept anywhere."""
    if not tenant.strip() or not name.strip():
        raise ValueError("token name and tenant must not be empty")
    if not TENANT_NAME.fullmatch(tenant):
        raise ValueError(
            f"invalid tenant name {tenant!r}: use at most 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. team-a)"
        )
    if "\x00" in name or len(name) > 128:
        raise ValueError("token name must be at most 128 characters, without NUL")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return secret, store.add_token(token_hash=hash_token(secret), name=name, tenant=tenant, admin=admin)


@dataclass(eq=False)
class TokenCache:
    """Live tokens as the store last answered for them, each for `ttl_seconds` (`FOXHUNT_TOKEN_CACHE_SECONDS`).

    Every request asked the database for its token: a query per request on the hot path. A token found live
    is taken from here until its entry is `ttl_seconds` old, so a token revoked meanwhile (`foxhunt token
    revoke` writes the database, from any process) keeps working for at most that long. An unknown or revoked
    token is never cached: it is asked for each time, and guessing fills nothing. 0 turns the cache off."""

    store: Store
    ttl_seconds: float
    max_entries: int = 10_000
    """Past this many tokens the cache starts over (a bound, not an LRU: it is refilled within one TTL)."""
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, tuple[float, TokenInfo]] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def cached(self, token_hash: str) -> TokenInfo | None:
        """The token if the cache has it live now, without asking the store (None: ask `find`)."""
        hit = self._entries.get(token_hash) if self.ttl_seconds > 0 else None
        return hit[1] if hit is not None and self.clock() < hit[0] else None

    def find(self, token_hash: str) -> TokenInfo | None:
        """The live token with this hash, from the cache while its entry is younger than the TTL."""
        if self.ttl_seconds <= 0:
            return self.store.find_token(token_hash)
        now = self.clock()
        hit = self._entries.get(token_hash)
        if hit is not None and now < hit[0]:
            return hit[1]
        info = self.store.find_token(token_hash)
        with self._lock:
            if info is None:
                self._entries.pop(token_hash, None)
            else:
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
                self._entries[token_hash] = (now + self.ttl_seconds, info)
        return info


def cached_principal(tokens: TokenCache, authorization: str | None) -> Principal | None:
    """The caller, if their token is in the cache now; None when the store must be asked (`authenticate`)."""
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    info = tokens.cached(hash_token(secret.strip()))
    return None if info is None else Principal(tenant=info.tenant, name=info.name, admin=info.admin)


def authenticate(tokens: Store | TokenCache, authorization: str | None) -> Principal:
    """Principal for an `Authorization: Bearer <token>` header, or Unauthorized (the store asked directly, or
    through a TokenCache)."""
    if not authorization:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    digest = hash_token(secret.strip())
    info = tokens.find(digest) if isinstance(tokens, TokenCache) else tokens.find_token(digest)
    if info is None:
        raise Unauthorized("unknown or revoked token")
    return Principal(tenant=info.tenant, name=info.name, admin=info.admin)
