"""API tokens: creation, verification and revocation.

A token is ``nb_`` followed by 43 URL-safe characters (256 random bits from :mod:`secrets`). Only
its SHA-256 digest is stored: with that much entropy a plain hash is enough (no salt or slow
KDF needed, as for GitHub's and PyPI's API tokens), and lookup by digest stays an index probe.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import Conflict, InvalidInput, NotFound, Unauthorized
from service.models import ApiToken
from service.models.base import utcnow

TOKEN_PREFIX = "nb_"
NAME_MAX = 128


def hash_token(token: str) -> str:
    """SHA-256 hex digest (64 characters) of a plain token."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, *, name: str) -> tuple[ApiToken, str]:
    """Create a token called ``name``.

    Returns:
        The stored row and the plain token; the plain token cannot be recovered later.

    Raises:
        InvalidInput: empty or over-long name.
        Conflict: a token with this name exists.
    """
    name = name.strip()
    if not name or len(name) > NAME_MAX:
        raise InvalidInput(f"token name must be 1 to {NAME_MAX} characters, got {name!r}")
    if session.scalar(select(ApiToken.id).where(ApiToken.name == name)) is not None:
        raise Conflict(f"a token named {name!r} exists; revoke it first or pick another name")
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(name=name, token_hash=hash_token(plain))
    session.add(token)
    session.flush()
    return token, plain


def find_token(session: Session, *, token: str | None) -> ApiToken:
    """The stored token matching ``token``, read only.

    Raises:
        Unauthorized: no token given, or it matches no stored token.
    """
    if not token:
        raise Unauthorized("this endpoint needs an API token: send 'Authorization: Bearer <token>'")
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
    if row is None:
        raise Unauthorized("the API token is not valid (unknown or revoked)")
    return row


def verify_token(session: Session, *, token: str | None) -> ApiToken:
    """The stored token matching ``token``; records its use.

    Raises:
        Unauthorized: no token given, or it matches no stored token.
    """
    row = find_token(session, token=token)
    row.last_used_at = utcnow()
    session.flush()
    return row


def revoke_token(session: Session, *, name: str) -> None:
    """Delete the token called ``name``. Raises NotFound when there is none."""
    row = session.scalar(select(ApiToken).where(ApiToken.name == name))
    if row is None:
        raise NotFound(f"no token named {name!r}")
    session.delete(row)
    session.flush()


def list_tokens(session: Session) -> list[ApiToken]:
    """Every token, oldest first (digests only; plain tokens are never stored)."""
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))
