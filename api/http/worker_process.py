"""One worker process of ``serve --workers N`` (api/http/workers.py starts it as ``python -m
better_compute.api.http.worker_process DOC``): ``serve`` on the socket inherited from the
parent, as long as the parent lives.

A module apart from workers.py, which serve.py imports: the worker imports serve.py.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys


def worker_main() -> None:
    """A worker: ``serve`` on the inherited socket (see api/http/workers.py)."""
    doc = json.loads(sys.argv[1])
    _die_with_parent(int(doc["parent"]))
    # ``kill -USR1 PID``: every thread's stack on stderr, for a worker that seems stuck (once
    # it serves, its tasks too: api/http/introspect.py).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from better_compute.api.http.metrics import as_worker_of
    from better_compute.api.http.serve import ServeOptions, serve
    from better_compute.domain.errors import BetterComputeError

    as_worker_of(int(doc["parent"]))

    options = ServeOptions(**{**doc["options"], "workers": 1})
    try:
        serve(options, dict(os.environ), fd=int(doc["fd"]), worker_index=int(doc["index"]),
              worker_count=int(doc["options"]["workers"]))
    except BetterComputeError as exc:  # for the parent to raise (_await_ready)
        print("error " + json.dumps({"code": exc.code, "message": exc.message}), flush=True)
        sys.exit(1)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker when its parent ends (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the call: nobody to serve for
        os._exit(1)



if __name__ == "__main__":
    worker_main()
