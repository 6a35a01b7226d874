"""A request body size limit: a body over `--max-request-body-size` bytes gets 413 in OpenAI's error shape.

Mirrors vLLM's VLLM_HTTP_MAX_REQUEST_BODY_SIZE (vllm/envs.py, default 32 MiB). An ASGI middleware: a declared
`Content-Length` over the limit is answered at once, before any of the body is read; a body sent without one
(chunked) is counted as it arrives and refused as soon as it passes the limit, so no more than the limit is
ever held in memory.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

PAYLOAD_TOO_LARGE = 413


def too_large_message(limit: int) -> str:
    return f"the request body is larger than the server's limit of {limit} bytes (see --max-request-body-size)"


class RequestBodyLimitMiddleware:
    """Refuse HTTP request bodies over `max_body_size` bytes (413)."""

    def __init__(self, app: Any, max_body_size: int) -> None:
        self.app = app
        self.max_body_size = max_body_size

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_size:
            await self._refuse(send)
            return
        received = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_size:   # the app's HTTPException handler answers it (OpenAI shape)
                    raise StarletteHTTPException(PAYLOAD_TOO_LARGE, too_large_message(self.max_body_size))
            return message

        await self.app(scope, limited_receive, send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"error": {"message": too_large_message(self.max_body_size),
                                     "type": "ContentTooLargeError", "param": None,
                                     "code": PAYLOAD_TOO_LARGE}}).encode()
        await send({"type": "http.response.start", "status": PAYLOAD_TOO_LARGE,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
