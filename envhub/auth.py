"""envhub's side of the shared token (``common/auth.py``): every request must carry it.

A client sends ``Authorization: Bearer <token>`` (``EnvClient`` does when given the token). A
browser opens ``/ui?token=<token>`` once: the answer sets a cookie that later requests carry.
A request without the token is answered 401, logged (rate-limited) and counted in
``/health``'s ``auth_refused``. Without a token the server binds loopback only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from common.auth import tokens_match

log = logging.getLogger(__name__)

COOKIE = "longhorizon_token"
_LOG_EVERY_S = 10.0


class TokenMiddleware:
    """ASGI middleware: HTTP requests without the token get 401 and never reach a route."""

    def __init__(self, app, token: str, refusals: Counter[str]):
        self.app, self._token = app, token
        self._refusals = refusals  # the server's error counts: /health shows auth_refused
        self._last_log_s = -_LOG_EVERY_S

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given, from_query = _presented_token(scope)
        if not tokens_match(given, self._token):
            await self._refuse(scope, send)
            return
        if not from_query:
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message) -> None:  # remember a token given in the URL
            if message["type"] == "http.response.start":
                cookie = f"{COOKIE}={self._token}; Path=/; HttpOnly; SameSite=Strict".encode()
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    async def _refuse(self, scope, send) -> None:
        self._refusals["auth_refused"] += 1
        now_s = time.monotonic()
        if now_s - self._last_log_s >= _LOG_EVERY_S:
            self._last_log_s = now_s
            client = scope.get("client") or ("?", 0)
            log.warning("refused %s %s from %s: no valid token; %d refusals so far",
                        scope.get("method"), scope.get("path"), client[0], self._refusals["auth_refused"])
        body = b'{"detail":"missing or wrong token: send Authorization: Bearer <LONGHORIZON_TOKEN>"}'
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def _presented_token(scope) -> tuple[str | None, bool]:
    """The token a request carries (header, then cookie, then ``?token=``) and whether it came
    from the query string."""
    headers = dict(scope.get("headers") or [])
    authorization = headers.get(b"authorization", b"").decode(errors="replace")
    if authorization.startswith("Bearer "):
        return authorization.removeprefix("Bearer ").strip(), False
    cookie = SimpleCookie(headers.get(b"cookie", b"").decode(errors="replace"))
    if COOKIE in cookie:
        return cookie[COOKIE].value, False
    query = parse_qs(scope.get("query_string", b"").decode(errors="replace")).get("token")
    return (query[0], True) if query else (None, False)
