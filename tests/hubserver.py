"""A tiny stand-in for the model hub, on 127.0.0.1, for fetch tests.

It speaks the part of the hub's protocol huggingface-hub uses to download one
file: ``HEAD``/``GET /{repo}/resolve/{revision}/{path}`` answering
``X-Repo-Commit``, ``ETag`` and, for LFS files, ``X-Linked-Etag`` (the quoted
SHA-256) and ``X-Linked-Size``, with ``Range`` support (206). Faults can be
switched on per file: serve other bytes than announced, cut the connection
mid-file once, and optionally stay down (503 to every download) after the cut.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote, urlsplit


@dataclass
class HubFile:
    """One file as the hub stores it; ``served`` overrides the bytes sent (a lying hub)."""

    content: bytes
    lfs: bool = True
    served: bytes | None = None

    @property
    def sha256(self) -> str:
        """The SHA-256 the hub announces (of ``content``, whatever it serves)."""
        return hashlib.sha256(self.content).hexdigest()


@dataclass
class FakeHub:
    """Repositories at one revision each, plus the faults to inject and a request log."""

    repo: str
    revision: str
    files: dict[str, HubFile]
    cut_once: set[str] = field(default_factory=set)  # cut the first GET of these mid-file
    down_after_cut: bool = False  # after a cut, answer 503 to every GET until ``down`` is reset
    down: bool = False
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, range)
    lock: threading.Lock = field(default_factory=threading.Lock)


class HubServer:
    """Serve a :class:`FakeHub` on an ephemeral port; use as a context manager."""

    def __init__(self, hub: FakeHub) -> None:
        self.hub = hub
        handler = type("Handler", (_Handler,), {"hub": hub})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL to pass as the hub endpoint."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        hub = self.hub
        path = unquote(urlsplit(self.path).path)
        byte_range = self.headers.get("Range", "")
        with hub.lock:
            hub.requests.append((self.command, path, byte_range))
        prefix = f"/{hub.repo}/resolve/{hub.revision}/"
        if not path.startswith(prefix) or path[len(prefix) :] not in hub.files:
            self._status(404, {"X-Error-Code": "EntryNotFound"})
            return
        name = path[len(prefix) :]
        entry = hub.files[name]
        data = entry.served if entry.served is not None else entry.content
        headers = {
            "X-Repo-Commit": hub.revision,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if entry.lfs:
            headers["ETag"] = f'"{entry.sha256}"'
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
            headers["X-Linked-Size"] = str(len(entry.content))
        else:
            headers["ETag"] = f'"{hashlib.sha1(entry.content).hexdigest()}"'
        if body and hub.down:
            self._status(503, {})
            return
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", byte_range)
        if match and body:
            start = int(match.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        headers["Content-Length"] = str(len(data) - start)
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not body:
            return
        payload = data[start:]
        with hub.lock:
            cut = name in hub.cut_once and not start
            if cut:
                hub.cut_once.discard(name)
                hub.down = hub.down_after_cut
        if cut:
            # Half the body, then the connection drops: the client sees a short read.
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(payload)

    def _status(self, code: int, headers: dict[str, str]) -> None:
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()
