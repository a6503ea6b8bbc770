"""Request bodies are bounded in size and in time, before any route reads them.

Without this a client could hold the controller's memory (a 50 MB body is read and parsed whole) or
one of its connections (a Content-Length with no body behind it) for as long as it liked.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import errors
from service.api.middleware import HttpMiddleware
from service.errors import BodyTimeout, BodyTooLarge, DomainError


class BodyLimit(HttpMiddleware):
    """Pure ASGI middleware: a body longer than `max_bytes` is 413, one slower than `timeout_seconds` 408.

    A declared Content-Length over the limit is refused before a byte of the body is read; a chunked
    body is counted as it streams and refused at the first chunk past the limit. The deadline covers
    the whole body from the request's start, so a client trickling a byte at a time is stopped too.
    Routes see the errors as `BodyTooLarge`/`BodyTimeout` (problem+json via `service.api.errors`).
    Any response sent before the body was read to its end closes the connection, so the unread rest
    is never parsed as a next request."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_seconds: float) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, self._too_large(f"it declares {int(declared)} bytes"))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds
        received = 0
        # a request without Content-Length and Transfer-Encoding has no body (RFC 9112, section 6.3)
        complete = declared in ("0", None) and "transfer-encoding" not in headers
        started = False

        async def bounded_receive() -> Message:
            nonlocal received, complete
            if complete:  # the body is read: later calls wait for a disconnect, for as long as a response streams
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(
                    f"the request body did not arrive within {self.timeout_seconds:g} s ({received} bytes came)"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large(f"it ran past that ({received} bytes so far)")
                complete = not message.get("more_body", False)
            return message

        async def closing_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if not complete:
                    MutableHeaders(scope=message)["connection"] = "close"
            await send(message)

        try:
            await self.app(scope, bounded_receive, closing_send)
        except (BodyTooLarge, BodyTimeout) as error:  # raised where no exception handler runs
            if started:
                raise
            await self._refuse(scope, receive, send, error)

    def _too_large(self, why: str) -> BodyTooLarge:
        return BodyTooLarge(f"the request body is limited to {self.max_bytes} bytes, and {why}")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: DomainError) -> None:
        """The problem+json answer, with the connection closed: the body behind it stays unread."""
        response = errors.domain_problem(Request(scope), error)
        response.headers["connection"] = "close"
        await response(scope, receive, send)
