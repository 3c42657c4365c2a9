"""The client side of benchmarks/reservations.py: processes of threads, each thread with its
own kept-alive HTTPS connection and token, creating or releasing reservations through the
JSON-RPC API, and sending back what each call took."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from typing import Any

RPC_PATH = "/api/compute/rpc"


class Rpc:
    """One kept-alive HTTPS connection speaking JSON-RPC."""

    def __init__(self, port: int, token: str, ca_pem: str) -> None:
        context = ssl.create_default_context(cadata=ca_pem)
        self.conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=120)
        self.headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        self.n = 0

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self.n += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        self.conn.request("POST", RPC_PATH, body, self.headers)
        answer = json.loads(self.conn.getresponse().read())
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]


def client_process(port: int, ca_pem: str, jobs: list[dict[str, Any]],
                    ready: Any, go: Any, start: Any, results: Any) -> None:
    """Runs one thread per job; each job is a create phase (``seconds`` from ``start``, or
    ``count``), a release phase (``release``: ids) or, with ``method``, that call without
    params for ``seconds`` (the path's floor: ``system.whoami``)."""
    rpcs = [Rpc(port, job["token"], ca_pem) for job in jobs]
    for rpc in rpcs:
        rpc.call("system.whoami", {})  # the TLS handshake, before the clock starts
    ready.release()
    go.wait()
    out: list[tuple[list[float], list[str], list[str], float]] = []
    lock = threading.Lock()

    def run(rpc: Rpc, job: dict[str, Any]) -> None:
        lat: list[float] = []
        ids: list[str] = []
        errors: list[str] = []
        until = start.value + job["seconds"] if job.get("seconds") else None
        left = job.get("count", 0)
        todo = list(job.get("release", ()))
        while True:
            if todo:
                method, params = "reservations.release", {"reservationId": todo.pop()}
            elif (until is not None and time.monotonic() < until) or left > 0:
                left -= 1
                method, params = (job["method"], {}) if job.get("method") else (
                    "reservations.create", {"poolId": job["pool"], "gpus": 1, "duration": "1h"})
            else:
                break
            started = time.perf_counter()
            try:
                result = rpc.call(method, params)
            except Exception as exc:  # counted and shown, never hidden
                errors.append(repr(exc)[:300])
                continue
            lat.append(time.perf_counter() - started)
            if method == "reservations.create":
                ids.append(result["id"])
        with lock:
            out.append((lat, ids, errors, time.monotonic()))

    threads = [threading.Thread(target=run, args=(rpc, job)) for rpc, job in zip(rpcs, jobs, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(out)


