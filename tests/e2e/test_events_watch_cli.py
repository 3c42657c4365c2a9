"""`better-compute events watch` as a user runs it: resume across restarts and kill -9."""

from __future__ import annotations

import signal
import threading

from tests.support import CLI, client_env, free_port, initialize, open_runtime, run, serve
from tests.watching import CliWatcher, log_sequences, watch_env, write_sites


def test_resume_after_a_server_restart_yields_exactly_the_missed_events(
        env: dict[str, str]) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    port = free_port()
    try:
        before = write_sites(runtime, 3)
        with serve(watch_env(env), port=port) as server:
            watcher = CliWatcher(client_env(env, server, token), "--since", str(before[0]),
                                 "--types", "site.*")
            assert [e["sequence"] for e in watcher.events(2)] == before[1:]
        # The server is down: these are written straight to the store meanwhile.
        missed = write_sites(runtime, 5)
        with serve(watch_env(env), port=port):
            got = watcher.events(5)
            assert [e["sequence"] for e in got] == missed
            assert watcher.no_more_events(within=1.0)  # no duplicate of the first two
            code, stderr = watcher.stop(signal.SIGINT)
        assert code in (0, 130)
        assert "Traceback" not in stderr
        assert "reconnecting" in stderr and f"after sequence {before[-1]}" in stderr
    finally:
        runtime.close()


def test_kill_9_during_a_stream_then_the_cli_resumes_without_gap_or_duplicate(
        env: dict[str, str]) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    port = free_port()
    start = log_sequences(runtime)[-1]
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:  # a steady flow of events, while the server dies and comes back
        while not stop.is_set():
            written.extend(write_sites(runtime, 5, per_save=5))

    thread = threading.Thread(target=writer)
    try:
        with serve(watch_env(env), port=port) as server:
            watcher = CliWatcher(client_env(env, server, token), "--since", str(start))
            thread.start()
            first = watcher.events(20)
            server.kill(signal.SIGKILL)
        with serve(watch_env(env), port=port):
            rest = watcher.events(40)
            stop.set()
            thread.join()
            total = len(log_sequences(runtime, start))
            rest += watcher.events(total - len(first) - len(rest))
            got = [e["sequence"] for e in first + rest]
            assert got == log_sequences(runtime, start)  # every event once, in order
            assert watcher.no_more_events(within=1.0)
            code, stderr = watcher.stop(signal.SIGTERM)
        assert code in (0, -signal.SIGTERM) and "Traceback" not in stderr
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        runtime.close()


def test_expired_is_final_with_a_clear_message(env: dict[str, str]) -> None:
    token = initialize(env)
    with serve(watch_env(env)) as server:
        done = run([CLI, "events", "watch", "--since", "999999"],
                   client_env(env, server, token), timeout=60)
    assert done.returncode == 1
    assert "beyond the head" in done.stderr and "--since 0" in done.stderr
    assert "Traceback" not in done.stderr
