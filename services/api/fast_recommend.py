"""POST /v1/recommend on a short path.

FastAPI spends a good part of a request's CPU around the endpoint: the exception and
exit-stack middlewares, route matching, the request object, dependency solving, the response
object (docs/benchmarks/code-notes.md). ``RecommendFastPath``
answers a well-formed request itself, validated exactly as FastAPI validates it (``json.loads``,
then the request model in Python mode), with the same answer (``routes.recommend.answer``)
and the same error body for domain errors (``{"detail": ...}`` with the error's status).

Anything else — another route or method, a body that is not JSON or that the model rejects,
a client gone mid-body — is replayed to FastAPI unchanged, so validation errors (422 naming
the field), the OpenAPI schema and every other route keep FastAPI's behaviour.
"""

from __future__ import annotations

import json

from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import CascadeError
from services.api.limits import replay
from services.api.routes.recommend import RECOMMEND_PATH, answer
from services.api.schemas import RecommendRequest
from services.errors import http_status


def _json_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json"
    return False


class RecommendFastPath:
    """Pure ASGI middleware in front of FastAPI's routing (inside the body-size limit)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != RECOMMEND_PATH
            or scope["method"] != "POST"
            or not _json_body(scope)
        ):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        request = _parse(messages)
        if request is None:
            await self.app(scope, replay(messages, receive), send)
            return
        try:
            body = await answer(request, scope["app"].state.gateway)
        except CascadeError as error:  # the same response as the app's handler gives
            detail = JSONResponse({"detail": str(error)}, status_code=http_status(error))
            await detail(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _parse(messages: list[Message]) -> RecommendRequest | None:
    """The request, or None when FastAPI should answer (not JSON, invalid, incomplete)."""
    if messages[-1]["type"] != "http.request":
        return None
    try:
        data = json.loads(b"".join(m.get("body", b"") for m in messages))
        return RecommendRequest.model_validate(data)
    except (ValueError, ValidationError):  # JSONDecodeError and UnicodeDecodeError too
        return None
