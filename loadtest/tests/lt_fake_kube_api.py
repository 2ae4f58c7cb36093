"""A local HTTP server speaking the few Kubernetes REST paths `slo-loadtest k8s` uses.

No API server can run on these machines (see loadtest/README.md), so the kubernetes Python
client is tested against this: real HTTP, real client (its REST layer, (de)serialisation and
streaming), a fake control plane. Creating a Job makes a pod for it; the test decides the pod's
phase and log text.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class FakeKubeAPI:
    def __init__(self, namespaces: set[str] | None = None) -> None:
        """``namespaces``: the namespaces that exist (None: every one)."""
        self.namespaces = namespaces
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, obj: Any, ctype: str = "application/json") -> None:
                data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": reason,
                        "code": code,
                        "message": message,
                    },
                )

            def _not_found(self, what: str) -> None:
                self._status(404, "NotFound", f"{what} not found")

            def do_POST(self) -> None:
                u = urlparse(self.path)
                api.requests.append(("POST", u.path))
                parts = u.path.strip("/").split("/")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                # /apis/batch/v1/namespaces/{ns}/jobs
                if parts[:3] == ["apis", "batch", "v1"] and parts[5:] == ["jobs"]:
                    ns, name = parts[4], body["metadata"]["name"]
                    # the API server's own messages for these two
                    if api.namespaces is not None and ns not in api.namespaces:
                        self._status(404, "NotFound", f'namespaces "{ns}" not found')
                    elif (ns, name) in api.jobs:
                        self._status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
                    else:
                        self._send(201, api.create_job(ns, body))
                else:
                    self._not_found(u.path)

            def do_GET(self) -> None:
                u = urlparse(self.path)
                api.requests.append(("GET", u.path + ("?" + u.query if u.query else "")))
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                parts = u.path.strip("/").split("/")
                if parts[:3] == ["apis", "batch", "v1"] and len(parts) >= 6:
                    ns = parts[4]
                    if len(parts) == 6:
                        items = [
                            j
                            for (n, _), j in api.jobs.items()
                            if n == ns and _match(j, q.get("labelSelector", ""))
                        ]
                        self._send(
                            200,
                            {
                                "kind": "JobList",
                                "apiVersion": "batch/v1",
                                "metadata": {},
                                "items": items,
                            },
                        )
                        return
                    job = api.jobs.get((ns, parts[6]))
                    self._send(200, job) if job else self._not_found(f"job {parts[6]}")
                    return
                if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[4] == "pods":
                    ns = parts[3]
                    if len(parts) == 5:
                        items = [
                            p
                            for (n, _), p in api.pods.items()
                            if n == ns and _match(p, q.get("labelSelector", ""))
                        ]
                        self._send(
                            200,
                            {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items},
                        )
                        return
                    key = (ns, parts[5])
                    if key not in api.pods:
                        self._not_found(f"pod {parts[5]}")
                        return
                    if len(parts) == 7 and parts[6] == "log":
                        if q.get("follow") == "true":
                            self._follow(key)
                        else:
                            self._send(200, api.logs.get(key, "").encode(), "text/plain")
                        return
                    self._send(200, api.pods[key])
                    return
                self._not_found(u.path)

            def _follow(self, key: tuple[str, str]) -> None:
                """Chunked stream of the log until the pod is no longer Running."""
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = 0
                while True:
                    text = api.logs.get(key, "")
                    if len(text) > sent:
                        data = text[sent:].encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                        sent = len(text)
                    if api.pods[key]["status"]["phase"] != "Running" and sent >= len(
                        api.logs.get(key, "")
                    ):
                        break
                    time.sleep(0.05)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- state -------------------------------------------------------------------------------

    def create_job(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        name = body["metadata"]["name"]
        job = json.loads(json.dumps(body))
        job["metadata"].update({"namespace": ns, "uid": f"uid-{name}", "creationTimestamp": now})
        job["status"] = {"active": 1}
        pod_name = f"{name}-abcde"
        labels = dict(job["spec"]["template"]["metadata"].get("labels", {}))
        labels["job-name"] = name
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": labels,
                "creationTimestamp": now,
            },
            "spec": job["spec"]["template"]["spec"],
            "status": {"phase": "Pending"},
        }
        with self.lock:
            self.jobs[(ns, name)] = job
            self.pods[(ns, pod_name)] = pod
            self.logs[(ns, pod_name)] = ""
        return job

    def set_pod(self, ns: str, job: str, phase: str, log: str | None = None) -> None:
        for (n, _), pod in self.pods.items():
            if n == ns and pod["metadata"]["labels"].get("job-name") == job:
                if log is not None:
                    self.logs[(ns, pod["metadata"]["name"])] = log
                pod["status"]["phase"] = phase

    def _pod_of(self, ns: str, job: str) -> dict[str, Any]:
        (pod,) = [
            p
            for (n, _), p in self.pods.items()
            if n == ns and p["metadata"]["labels"].get("job-name") == job
        ]
        return pod

    def _container_status(self, pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """A V1ContainerStatus as the kubelet reports it (the client requires these fields)."""
        c = pod["spec"]["containers"][0]
        return {
            "name": c["name"], "image": c["image"], "imageID": "", "ready": False,
            "restartCount": 0, "started": False, "state": state,
        }  # fmt: skip

    def set_waiting(self, ns: str, job: str, reason: str, message: str) -> None:
        """The pod was scheduled but its container cannot start (ImagePullBackOff, ...)."""
        pod = self._pod_of(ns, job)
        pod["status"] = {
            "phase": "Pending",
            "conditions": [_condition("PodScheduled", "True")],
            "containerStatuses": [
                self._container_status(pod, {"waiting": {"reason": reason, "message": message}})
            ],
        }

    def set_unschedulable(self, ns: str, job: str, message: str) -> None:
        """No node fits the pod: the scheduler's condition, as kube-scheduler writes it."""
        self._pod_of(ns, job)["status"] = {
            "phase": "Pending",
            "conditions": [_condition("PodScheduled", "False", "Unschedulable", message)],
        }

    def set_terminated(self, ns: str, job: str, reason: str, exit_code: int) -> None:
        pod = self._pod_of(ns, job)
        state = {"terminated": {"reason": reason, "exitCode": exit_code}}
        pod["status"] = {
            "phase": "Failed",
            "containerStatuses": [self._container_status(pod, state)],
        }

    def finish_job(self, ns: str, job: str, ok: bool) -> None:
        j = self.jobs[(ns, job)]
        j["status"] = {
            "succeeded" if ok else "failed": 1,
            "conditions": [
                {
                    "type": "Complete" if ok else "Failed",
                    "status": "True",
                    "reason": "Completed" if ok else "BackoffLimitExceeded",
                    "message": "",
                }
            ],
        }

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cond = {"type": type_, "status": status, "lastTransitionTime": now}
    return cond | ({"reason": reason, "message": message} if reason else {})


def _match(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels", {}) or {}
    for term in filter(None, selector.split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True
