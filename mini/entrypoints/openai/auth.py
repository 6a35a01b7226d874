"""API keys for the server: `--api-key KEY [KEY ...]` or `MINI_API_KEY`, checked on every `/v1` route.

Mirrors vllm/entrypoints/serve/middleware/authenticate.py (`AuthenticationMiddleware`, a pure ASGI
middleware) and vllm/entrypoints/serve/middleware/register.py (the keys come from `--api-key`, a list, and
only when it is absent from the environment variable `VLLM_API_KEY`, one key; vllm/entrypoints/common/
cli_args.py). As vLLM: a request under `/v1` passes only with `Authorization: Bearer KEY` for one of the
keys (the scheme's case does not matter); `/health`, `/metrics` and `/openapi.json` stay open; OPTIONS
requests (CORS preflight) pass; the presented key is compared in constant time (SHA-256 digests compared
with `secrets.compare_digest`, against every key with no early exit, so neither the key's length nor
which key matched shows in the timing).

Where mini differs: the 401 is in OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`
with `WWW-Authenticate: Bearer` (vLLM answers `{"error": "Unauthorized"}`), so OpenAI clients raise their
`AuthenticationError`; only the `/v1` prefix is guarded (mini serves nothing under vLLM's other prefixes).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

API_KEY_ENV = "MINI_API_KEY"
GUARDED_PREFIX = "/v1"


def api_keys_from(cli_keys: Sequence[str] | None, environ: dict[str, str] | None = None) -> list[str]:
    """The keys the server requires: the `--api-key` ones, else `MINI_API_KEY`, else none (open server)."""
    environ = os.environ if environ is None else environ
    keys = list(cli_keys) if cli_keys else [environ.get(API_KEY_ENV, "")]
    return [key for key in keys if key]


def unauthorized_body(message: str) -> dict:
    return {"error": {"message": message, "type": "AuthenticationError", "param": None, "code": 401}}


class AuthenticationMiddleware:
    """Answer 401 to a `/v1` request without `Authorization: Bearer <one of the keys>`."""

    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        if not api_keys or not all(isinstance(key, str) and key for key in api_keys):
            raise ValueError(f"api_keys must be a non-empty list of non-empty str, got {list(api_keys)!r}")
        self.app = app
        self.key_digests = [hashlib.sha256(key.encode()).digest() for key in api_keys]

    def authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        matched = False
        for key_digest in self.key_digests:  # every key, no early exit: constant time
            matched |= secrets.compare_digest(digest, key_digest)
        return matched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        guarded = path == GUARDED_PREFIX or path.startswith(GUARDED_PREFIX + "/")
        if guarded and not self.authorized(Headers(scope=scope)):
            response = JSONResponse(
                unauthorized_body("missing or wrong API key: send the header 'Authorization: Bearer <key>'"),
                status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
