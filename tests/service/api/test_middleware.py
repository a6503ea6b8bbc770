"""HttpMiddleware: HTTP requests reach `http`, every other scope goes to the app untouched."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from service.api.middleware import HttpMiddleware


class Seen(HttpMiddleware):
    """Records which scopes it handled itself, then passes them on."""

    def __init__(self, app: object) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.handled: list[str] = []

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.handled.append(scope["path"])
        await self.app(scope, receive, send)


def test_only_http_scopes_reach_http_and_every_scope_reaches_the_app() -> None:
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(scope["type"])

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    middleware = Seen(app)
    for scope in ({"type": "lifespan"}, {"type": "websocket", "path": "/ws"}, {"type": "http", "path": "/v1/jobs"}):
        asyncio.run(middleware(scope, receive, send))
    assert (reached, middleware.handled) == (["lifespan", "websocket", "http"], ["/v1/jobs"])
