"""A local HTTP server on 127.0.0.1 (random free port) for the watcher's HTTP sources.

It speaks the Together cluster API shape (``GET /v1/compute/clusters/<id>`` with a bearer token,
answering a document with ``node_lifecycle_events``) and the cloud metadata services (AWS IMDSv2
spot ``instance-action``, GCP ``instance/preempted``, Azure Scheduled Events: ``GET`` and ``POST``
``/metadata/scheduledevents`` with ``Metadata: true``; ``server.azure_events`` are the events, each
``POST`` body lands in ``server.azure_acks``, and a new event list bumps ``DocumentIncarnation``).
``server.mode`` picks the answer: ``good``,
``malformed`` (not JSON), ``shape`` (JSON without the array), ``slow`` (sleeps past the client's
timeout), ``error`` (HTTP 500), ``redirect`` (302 to ``server.redirect_to``, as a hostile or broken
proxy would). Every request is remembered with its headers in ``server.requests``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, token: str = "test-token"):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.token = token
        self.mode = "good"
        # "slow" answers after a minute: past any client's timeout, however long a busy machine takes
        # to answer the others (its threads are daemons, so nobody waits for it at the end)
        self.slow_seconds = 60.0
        self.events: list[dict] = []
        self.aws_action: dict | None = None
        self.gcp_preempted = False
        self.azure_events: list = []
        self.azure_acks: list = []
        self._azure_seen: tuple[str, int] = ("[]", 0)  # the events as last answered, and the incarnation
        self.requests: list[dict] = []
        self.redirect_to = ""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def handle_error(self, request, client_address):  # a client that timed out is expected here
        pass

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def log_message(self, *args):  # keep test output quiet
        pass

    def _answer(self, code: int, body: str, content_type: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _misbehave(self) -> bool:
        mode = self.server.mode
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        if mode == "slow":
            time.sleep(self.server.slow_seconds)
        if mode == "error":
            self._answer(500, '{"error": "internal"}')
            return True
        if mode == "malformed":
            self._answer(200, "<html>gateway hiccup", "text/html")
            return True
        return False

    def do_PUT(self):
        self.server.requests.append({"method": "PUT", "path": self.path, "headers": dict(self.headers)})
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._answer(200, "aws-session-token", "text/plain")
        else:
            self._answer(400, "bad token request", "text/plain")

    def do_POST(self):
        self.server.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers)})
        if not self.path.startswith("/metadata/scheduledevents?"):
            self._answer(404, '{"error": "not found"}')
        elif self.headers.get("Metadata") != "true":
            self._answer(400, '{"error": "Bad request. Required metadata header not specified"}')
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self._misbehave():
                self.server.azure_acks.append(json.loads(body))
                self._answer(200, "")

    def do_GET(self):
        self.server.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
        if self.path.startswith("/metadata/scheduledevents?"):
            self._azure()
        elif self.path.startswith("/v1/compute/clusters/"):
            self._cluster()
        elif self.path == "/latest/meta-data/spot/instance-action":
            self._aws()
        elif self.path == "/computeMetadata/v1/instance/preempted":
            self._gcp()
        else:
            self._answer(404, '{"error": "not found"}')

    def _cluster(self):
        if self.headers.get("Authorization") != f"Bearer {self.server.token}":
            self._answer(401, '{"error": "unauthorized"}')
            return
        if self._misbehave():
            return
        cluster_id = self.path.rsplit("/", 1)[-1]
        if self.server.mode == "shape":
            self._answer(200, json.dumps({"cluster_id": cluster_id, "status": "Ready"}))
            return
        document = {
            "cluster_id": cluster_id,
            "status": "Ready",
            "desired_preemptible_gpus": 32,
            "allocated_preemptible_gpus": 24,
            "node_lifecycle_events": self.server.events,
        }
        self._answer(200, json.dumps(document))

    def _aws(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "aws-session-token":
            self._answer(401, "no token", "text/plain")
        elif self._misbehave():
            return
        elif self.server.aws_action is None:
            self._answer(404, "Not Found", "text/plain")
        else:
            self._answer(200, json.dumps(self.server.aws_action))

    def _azure(self):
        if self.headers.get("Metadata") != "true":
            self._answer(400, '{"error": "Bad request. Required metadata header not specified"}')
            return
        if self._misbehave():
            return
        text, incarnation = self.server._azure_seen
        if json.dumps(self.server.azure_events) != text:
            incarnation += 1
            self.server._azure_seen = (json.dumps(self.server.azure_events), incarnation)
        if self.server.mode == "shape":
            self._answer(200, json.dumps({"DocumentIncarnation": incarnation}))
            return
        self._answer(
            200, json.dumps({"DocumentIncarnation": incarnation, "Events": self.server.azure_events})
        )

    def _gcp(self):
        if self.headers.get("Metadata-Flavor") != "Google":
            self._answer(403, "missing Metadata-Flavor", "text/plain")
        elif not self._misbehave():
            self._answer(200, "TRUE" if self.server.gcp_preempted else "FALSE", "text/plain")
