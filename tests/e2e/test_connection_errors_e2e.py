"""A wrong BETTER_COMPUTE_URL or CA, against a real server: a hint and the right exit status.

Settings that cannot work (http:// to the HTTPS port, the agents' gateway given as the API, a
CA that does not sign the server's certificate) are `invalid_input`, exit 2: a script must not
retry them. A server that is not there (yet) stays `unavailable`, exit 11: retry.
"""

from __future__ import annotations

import pytest

from tests.support import CLI, client_env, free_port, initialize, run, serve


@pytest.mark.timeout(300)
def test_wrong_settings_say_what_to_fix_and_exit_2(env: dict[str, str]) -> None:
    token = initialize(env)
    gateway = free_port()
    with serve(env, "--gateway-listen", f"127.0.0.1:{gateway}", "--hostname", "localhost") \
            as server:
        good = client_env(env, server, token)
        no_ca = {k: v for k, v in good.items() if k != "BETTER_COMPUTE_CA_FILE"}
        cases = [
            ({**good, "BETTER_COMPUTE_URL": f"http://127.0.0.1:{server.port}"},
             f"port {server.port} speaks HTTPS, and the URL says http://",
             f"BETTER_COMPUTE_URL=https://127.0.0.1:{server.port}"),
            ({**good, "BETTER_COMPUTE_URL": f"https://127.0.0.1:{gateway}"},
             "the server asks for a client certificate", "that is the agents' gateway"),
            (no_ca, "the server's certificate is not trusted", "set BETTER_COMPUTE_CA_FILE"),
        ]
        for broken, what, fix in cases:
            for argv in (["api", "system.whoami"], ["events", "watch"]):
                done = run([CLI, *argv], broken, timeout=120)
                assert done.returncode == 2, (argv, done.stderr)
                assert done.stderr.startswith("error [invalid_input]: ")
                assert what in done.stderr and fix in done.stderr, done.stderr
                assert done.stdout == ""
        assert run([CLI, "api", "system.whoami"], good).returncode == 0
    nobody = {**good, "BETTER_COMPUTE_URL": f"https://127.0.0.1:{free_port()}"}
    done = run([CLI, "api", "system.whoami"], nobody)
    assert done.returncode == 11 and done.stderr.startswith("error [unavailable]: cannot reach")
