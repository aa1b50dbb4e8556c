"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every failure
the server can answer: our own checks, pydantic validation, unknown routes and crashes.

The openai client maps the status to its exception class (400 -> BadRequestError, 404 ->
NotFoundError), so the status matters as much as the body.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.entrypoints.openai.sse import sse_event

logger = logging.getLogger("tandem.server")

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
          405: "MethodNotAllowed", 415: "UnsupportedMediaType", 500: "InternalServerError",
          501: "NotImplementedError", 503: "ServiceUnavailableError"}


class OpenAIError(Exception):
    """Raised by serving code; turned into an error response by the handler below."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None,
                 type: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.type = type or _TYPES.get(status, HTTPStatus(status).phrase)


def error_body(message: str, status: int, type: Optional[str] = None,
               param: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type or _TYPES.get(status, "Error"),
                      "param": param, "code": status}}


class _ASCIIJSONResponse(JSONResponse):
    """Escapes non-ASCII: an error message may quote text that UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(message: str, status: int = 400, type: Optional[str] = None,
                   param: Optional[str] = None) -> JSONResponse:
    return _ASCIIJSONResponse(error_body(message, status, type, param), status_code=status)


def sse_error(error: OpenAIError | Exception) -> bytes:
    """An error inside an SSE stream (headers are already sent, so the status cannot change)."""
    if isinstance(error, OpenAIError):
        body = error_body(error.message, error.status, error.type, error.param)
    else:
        body = error_body(str(error), 500)
    return sse_event(body)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        msg = err.get("msg", "invalid value")
        if err.get("type") == "json_invalid":
            msg = "request body is not valid JSON"
        parts.append(f"{loc}: {msg}" if loc else msg)
    count = len(parts)
    return f"{count} validation error{'s' if count != 1 else ''}: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc.message, exc.status, exc.type, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        # vLLM answers schema violations with 400 "Bad Request", never 422.
        return error_response(_validation_message(exc), 400, HTTPStatus.BAD_REQUEST.phrase)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(message, exc.status_code)

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(f"internal server error: {type(exc).__name__}: {exc}", 500)
