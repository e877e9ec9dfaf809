"""Shared pieces of the HTTP layer: error responses, common parameters, fast JSON.

Every error answers ``{"detail": "<message>"}`` with the status of its
:mod:`service.errors` class; :func:`errors` documents those statuses on a route so the OpenAPI
schema lists every answer the route can give.
"""

from __future__ import annotations

import itertools
import re
from datetime import date
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import orjson
from fastapi import Path, Query
from fastapi.responses import Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

# Postgres rejects NUL in text and int4 ends at 2**31 - 1: both are refused here with a 422
# instead of reaching the database as a 500.
NAME_PATTERN = r"^[^\x00-\x1f/]+$"
MAX_ID = 2**31 - 1


def _iso_date(value: Any) -> Any:
    # pydantic's lax mode would take 0 or "1700000000" as a date; nights are YYYY-MM-DD only.
    if isinstance(value, date) or (
        isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value)
    ):
        return value
    raise ValueError("must be a date written YYYY-MM-DD")


IsoDate = Annotated[date, BeforeValidator(_iso_date)]
ModelName = Annotated[
    str,
    Path(
        min_length=1, max_length=128, pattern=NAME_PATTERN, description="model name, e.g. resnet18"
    ),
]
Id = Annotated[int, Path(ge=1, le=MAX_ID)]
FilterText = Annotated[str | None, Query(min_length=1, max_length=64, pattern=NAME_PATTERN)]
Night = Annotated[IsoDate | None, Query(description="YYYY-MM-DD")]
Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Cursor = Annotated[
    int | None, Query(ge=1, le=MAX_ID, description="next_cursor of the previous page")
]


class StrictBody(BaseModel):
    """A request body that refuses unknown fields with one error naming the first few.

    pydantic's ``extra="forbid"`` makes one error object per unknown key: a 16 MiB object of
    unknown keys cost 1.67 GB and 14.6 s to refuse (docs/reliability.md). This check costs one
    pass over the keys and one message, whatever their number.
    """

    model_config = ConfigDict(extra="ignore", json_schema_extra={"additionalProperties": False})

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = (k for k in data if k not in cls.model_fields)
            first = list(itertools.islice(unknown, 5))
            if first:
                more = sum(1 for _ in unknown)
                raise ValueError(
                    f"unknown fields {', '.join(repr(str(k)[:64]) for k in first)}"
                    + (f" and {more} more" if more else "")
                    + f"; known: {', '.join(cls.model_fields)}"
                )
        return data


class ErrorRead(BaseModel):
    """An error answer: detail says what was wrong."""

    detail: str


_DESCRIPTIONS = {
    400: "the request body is not valid JSON",
    401: "missing or invalid API token",
    404: "not found",
    409: "conflicts with stored state",
    413: "the request body is over the size limit",
    422: "invalid input; the message names the field",
    503: "the database is unreachable",
}


def errors(*statuses: int, json_route: bool = True) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the given error statuses, all ``{"detail": str}`` in JSON.

    ``json_route=False`` for routes answering another media type (HTML, SVG), whose error
    bodies would otherwise be documented in the route's own media type.
    """
    if json_route:
        return {s: {"model": ErrorRead, "description": _DESCRIPTIONS[s]} for s in statuses}
    ref = {"$ref": "#/components/schemas/ErrorRead"}
    return {
        s: {"description": _DESCRIPTIONS[s], "content": {"application/json": {"schema": ref}}}
        for s in statuses
    }


def json_response(payload: Any, status_code: int = 200) -> Response:
    """A JSON response from plain values and numpy arrays (dates as ``YYYY-MM-DD``, NaN as null).

    The history endpoint returns tens of thousands of points: encoding plain values once with
    orjson is an order of magnitude faster than validating them as pydantic models and encoding
    with the standard library; the route still declares its pydantic model for the schema.
    """
    # numpy columns go out as JSON arrays, NaN as null.
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
    )


def url(path: str, **params: Any) -> str:
    """A relative URL with quoted path and the non-None query parameters."""
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return quote(path) + (f"?{query}" if query else "")
