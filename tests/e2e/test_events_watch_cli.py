"""`better-compute events watch` as a user runs it: resume across restarts and kill -9."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
from pathlib import Path

from tests.support import (
    CLI,
    Server,
    client_env,
    free_port,
    initialize,
    open_runtime,
    run,
    serve,
    wait_for_line,
)
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
        assert code == 143 and "Traceback" not in stderr  # SIGTERM: 128 + 15
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
    assert done.returncode == 9 and "\nerror [expired]: " in "\n" + done.stderr
    assert "beyond the head" in done.stderr and "--since 0" in done.stderr
    assert "Traceback" not in done.stderr


def _watch_started_like_a_background_job(env: dict[str, str], *args: str
                                         ) -> subprocess.Popen[str]:
    """`events watch` with SIGINT ignored on entry, as a non-interactive shell starts a
    background job (`scripts/test & scripts/test`): Python then leaves SIGINT ignored unless
    the program asks for it."""
    return subprocess.Popen([CLI, "events", "watch", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def _interrupt(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGINT)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError("events watch went on after Ctrl-C (SIGINT)") from None
    assert process.stderr is not None
    return code, process.stderr.read()


def test_ctrl_c_ends_a_connected_watch_at_once(env: dict[str, str]) -> None:
    token = initialize(env)
    with serve(watch_env(env)) as server:
        process = _watch_started_like_a_background_job(client_env(env, server, token),
                                                       "--since", "0")
        wait_for_line(process, '"sequence"')
        code, stderr = _interrupt(process)
    assert code == 130 and "Traceback" not in stderr


def test_ctrl_c_ends_a_watch_that_is_backing_off(env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()  # nothing listens: every attempt is refused, then it backs off
    process = _watch_started_like_a_background_job(
        {**client_env(env, Server(None, f"https://127.0.0.1:{port}", port), "biam_x"),  # type: ignore[arg-type]
         "BETTER_COMPUTE_CA_FILE": ""})
    assert process.stderr is not None
    line = process.stderr.readline()
    assert "reconnecting in" in line, line
    code, stderr = _interrupt(process)
    assert code == 130 and "Traceback" not in stderr


def test_ctrl_c_ends_a_watch_that_is_reconnecting(env: dict[str, str]) -> None:
    """A server that accepts the connection and never answers: the watch waits in the
    handshake, and Ctrl-C still ends it at once."""
    accepted = threading.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        held: list[socket.socket] = []

        def accept() -> None:
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])
                accepted.set()

        threading.Thread(target=accept, daemon=True).start()
        process = _watch_started_like_a_background_job(
            {**client_env(env, Server(None, f"https://127.0.0.1:{port}", port), "biam_x"),  # type: ignore[arg-type]
             "BETTER_COMPUTE_CA_FILE": ""})
        assert accepted.wait(30), "events watch never connected"
        code, stderr = _interrupt(process)
        for conn in held:
            conn.close()
    assert code == 130 and "Traceback" not in stderr
