"""The pure ASGI middlewares' shared part: they act on HTTP requests only."""

from __future__ import annotations

import abc

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware(abc.ABC):
    """Pure ASGI middleware (streams pass through untouched) that acts on HTTP requests only: the lifespan
    and websocket scopes go straight to the app, HTTP requests to `http`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    @abc.abstractmethod
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one HTTP request, calling `self.app` to pass it on."""
