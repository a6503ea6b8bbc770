"""Bearer tokens: high-entropy secrets shown once, stored as sha256, each bound to a tenant."""

from __future__ import annotations

import hashlib
import re
import secrets

from pydantic import BaseModel

from service.errors import Unauthorized
from service.store import Store, TokenInfo

TOKEN_PREFIX = "fxh_"
TENANT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
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
    if not TENANT_NAME.match(tenant):
        raise ValueError(
            f"invalid tenant name {tenant!r}: use at most 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. team-a)"
        )
    if "\x00" in name or len(name) > 128:
        raise ValueError("token name must be at most 128 characters, without NUL")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return secret, store.add_token(token_hash=hash_token(secret), name=name, tenant=tenant, admin=admin)


def authenticate(store: Store, authorization: str | None) -> Principal:
    """Principal for an `Authorization: Bearer <token>` header, or Unauthorized."""
    if not authorization:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    info = store.find_token(hash_token(secret.strip()))
    if info is None:
        raise Unauthorized("unknown or revoked token")
    return Principal(tenant=info.tenant, name=info.name, admin=info.admin)
