"""A small real HTTP server speaking just enough of the OpenAI chat API (streaming) for guidellm,
that records every request body it receives. Used to check what guidellm 0.8.1 actually sends
for our datasets; it is not a stand-in for vLLM in any latency test."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RecordingServer:
    def __init__(
        self,
        model: str = "rec-model",
        tokens: int = 10,
        delay_s: float = 0.0,
        special_tokens_only: bool = False,
        no_text: bool = False,
        reject_media: bool = False,
        require_authorization: str | None = None,
    ) -> None:
        """``special_tokens_only``: behave like vLLM serving a dummy-weight model that generates
        only ``<pad>``: the tokens are counted in ``usage`` but the streamed deltas are empty,
        unless the request body says ``"skip_special_tokens": false``. ``no_text``: empty deltas
        whatever the body says (random weights whose byte tokens never complete a character)."""
        self.model = model
        self.tokens = tokens
        self.delay_s = delay_s
        self.special_tokens_only = special_tokens_only
        self.no_text = no_text
        # answer a request with an image or video part 400, as vLLM does past
        # --limit-mm-per-prompt (text requests still succeed)
        self.reject_media = reject_media
        self.bodies: list[dict[str, Any]] = []  # streamed requests: what guidellm sends
        self.plain_bodies: list[dict[str, Any]] = []  # non-streamed (slo-loadtest's preflight)
        self.connection_headers: list[str | None] = []  # each POST's Connection header
        self.authorization: list[str | None] = []  # each streamed POST's Authorization header
        # with require_authorization, every request (GET /health and /v1/models too, as an
        # authenticating proxy would) without exactly this Authorization header is answered 401
        self.require_authorization = require_authorization
        # (method, path, Authorization header) of every request, answered or refused
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                auth = self.headers.get("Authorization")
                with server._lock:
                    server.requests.append((self.command, self.path, auth))
                if server.require_authorization is None or auth == server.require_authorization:
                    return True
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._json(401, {"error": {"message": "Unauthorized", "code": 401}})
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                if self.path.rstrip("/") == "/health":
                    self._json(200, {})
                elif self.path.rstrip("/") == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": server.model}]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                if len(raw) < n:
                    # the client went away after the headers: guidellm cancels the requests
                    # still in flight when a step ends. Recorded as a body, this was an empty
                    # "non-streamed request" (a flaky count in a fresh-clone run, 2026-12-06).
                    return
                body = json.loads(raw or b"{}")
                if not body.get("stream"):
                    with server._lock:
                        server.plain_bodies.append(body)
                    self._json(
                        200,
                        {
                            "id": "r",
                            "object": "chat.completion",
                            "model": server.model,
                            "choices": [{"index": 0, "message": {"content": " t0"}}],
                        },
                    )
                    return
                with server._lock:
                    server.bodies.append(body)
                    server.connection_headers.append(self.headers.get("Connection"))
                    server.authorization.append(self.headers.get("Authorization"))
                if not self.path.endswith("/chat/completions"):
                    self._json(404, {"error": "not found"})
                    return
                if server.reject_media and _has_media(body):
                    msg = "At most 0 video(s) may be provided in one prompt."
                    self._json(400, {"error": {"message": msg, "code": 400}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(server.tokens):
                    time.sleep(server.delay_s)
                    text = f" t{i}"
                    if server.special_tokens_only:
                        text = "" if body.get("skip_special_tokens", True) else "<pad>"
                    if server.no_text:
                        text = ""
                    chunk = {
                        "id": "r",
                        "object": "chat.completion.chunk",
                        "model": server.model,
                        "choices": [{"index": 0, "delta": {"content": text}}],
                        "usage": {
                            "prompt_tokens": 5,
                            "completion_tokens": i + 1,
                            "total_tokens": 6 + i,
                        },
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _has_media(body: dict[str, Any]) -> bool:
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type") != "text" for part in content
        ):
            return True
    return False
