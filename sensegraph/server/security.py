"""What keeps a local server local: an optional API key, request size limits and security
headers. CORS is added by the app only when origins are configured."""
from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import HTTPException, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

# Both forms are accepted: OpenAI clients send `Authorization: Bearer`, scripts often prefer a header.
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the server's API key")
bearer = HTTPBearer(auto_error=False, description="the server's API key as a bearer token")


async def require_key(request: Request, header_key: str | None = Security(api_key_header),
                      bearer_key: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
    """Refuse the request unless the configured key (if any) came with it."""
    expected: str | None = request.app.state.api_key
    if not expected:
        return
    given = header_key or (bearer_key.credentials if bearer_key else "")
    # compare_digest: the time taken does not reveal how much of a guess was right
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise HTTPException(401, "missing or wrong API key (send X-API-Key or Authorization: Bearer)",
                            headers={"WWW-Authenticate": "Bearer"})


class BodyLimit:
    """ASGI middleware: bodies over `max_bytes` get 413, whether announced by Content-Length or
    streamed in chunks (counted as they arrive, so a lying client cannot slip past)."""

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = True
                if too_big:
                    await self._refuse(send)
                    return
        received = 0
        started = refused = False

        async def counting_receive() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Answer 413 now and tell the app the client left: frameworks turn an
                    # exception raised here into their own 400, which would hide the reason.
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def watching_send(message: dict) -> None:
            nonlocal started
            if refused:
                return  # the 413 has been sent; whatever the app says now goes nowhere
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except Exception:
            if not refused:
                raise

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body larger than {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


# The explorer loads only its own files and talks only to its own origin.
PAGE_POLICY = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class SecurityHeaders:
    """ASGI middleware adding nosniff everywhere and a content security policy on the page.
    /docs is left without the policy: Swagger UI starts from an inline script."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")

        async def add_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"no-referrer"))
                if not path.startswith("/docs"):
                    headers.append((b"content-security-policy", PAGE_POLICY.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, add_headers)
