"""A real HTTP server on 127.0.0.1 that serves a few files and records every request it gets.

The dataset tests use it as the "internal service" a tenant would like the trainer to fetch from:
they assert what was (or was not) requested, not only what the loader answered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FileServer:
    url: str
    files: dict[str, bytes]
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(method, path) of every request, in order."""
    declared_sizes: dict[str, int] = field(default_factory=dict)
    """Content-Length a HEAD answers for a path, when it should lie about the size (the GET sends it all)."""


@contextmanager
def file_server(files: dict[str, bytes]) -> Iterator[FileServer]:
    """Serve `files` (path -> bytes) until the block ends; Range requests get the whole file (no 206)."""
    server_state = FileServer(url="", files=files)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            server_state.requests.append((self.command, self.path))
            content = server_state.files.get(self.path)
            if content is None:
                self.send_error(404)
                return
            self.send_response(200)
            size = server_state.declared_sizes.get(self.path, len(content)) if not body else len(content)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if body:
                self.wfile.write(content)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def log_message(self, *_: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
