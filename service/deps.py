"""FastAPI dependencies: one session per request, the settings, and the API token check.

The request owns the transaction (STYLE.md habit 1): :func:`get_session` commits once after the
route returns and rolls back if it raised. It is declared with ``scope="function"`` so the
commit happens before the response is sent: a failed commit becomes an error response instead
of a success the database never saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.auth import verify_token
from service.config import Settings, get_settings
from service.models import ApiToken


def get_session(request: Request) -> Iterator[Session]:
    """A session from the app's session factory; committed once, after the route."""
    session: Session = request.app.state.session_factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def settings_dep(request: Request) -> Settings:
    """The app's settings (those given to ``create_app``, else the process settings)."""
    return request.app.state.settings or get_settings()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(settings_dep)]

# auto_error=False: a missing header is our Unauthorized (401 with a clear message), not
# FastAPI's bare 403.
_bearer = HTTPBearer(auto_error=False, description="an API token from `nightbench token create`")


def require_token(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiToken:
    """The API token of the request. Raises Unauthorized when missing or unknown."""
    return verify_token(session, token=credentials.credentials if credentials else None)


TokenDep = Annotated[ApiToken, Depends(require_token)]
