"""events.list and `better-compute events list`, projections status/rebuild, in-process."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from better_compute.api.store.eventlog import EventLog, render
from better_compute.domain.events import public_event
from tests.support import cli_inprocess, initialize, open_runtime
from tests.watching import log_sequences, write_sites


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _token(env: dict[str, str], tenant: str, role: str = "admin") -> str:
    code, out, err = cli_inprocess(["tokens", "create", "--tenant", tenant, "--role", role,
                                    "--query", "token"], env)
    assert code == 0, err
    return out.strip()


def test_events_list_pages_the_log_with_since_types_and_limit(env: dict[str, str]) -> None:
    initialize(env)
    runtime = open_runtime(env)
    try:
        sites = write_sites(runtime, 7, per_save=3)
    finally:
        runtime.close()
    code, out, err = cli_inprocess(["events", "list"], env)
    assert code == 0, err
    every = _lines(out)
    assert [e["type"] for e in every[:3]] == ["pki.created", "tenant.created", "token.created"]
    assert [e["sequence"] for e in every[3:]] == sites
    code, out, _ = cli_inprocess(["events", "list", "--since", str(sites[1]), "--types", "site.*",
                                  "--limit", "3"], env)
    assert [e["sequence"] for e in _lines(out)] == sites[2:5]
    code, out, _ = cli_inprocess(["events", "list", "--types", "tenant.*,token.*"], env)
    assert [e["type"] for e in _lines(out)] == ["tenant.created", "token.created"]
    # The RPC page carries the head it was read at and where to continue.
    code, out, _ = cli_inprocess(["api", "events.list", "since:=0", "limit:=4", "types=site.*"], env)
    page = json.loads(out)
    assert [e["sequence"] for e in page["events"]] == sites[:4]
    assert page["next"] == sites[3] and page["head"] == sites[-1]
    code, out, _ = cli_inprocess(["api", "events.list", f"since:={sites[3]}", "limit:=100"], env)
    rest = json.loads(out)
    assert [e["sequence"] for e in rest["events"]] == sites[4:]
    assert rest["next"] == rest["head"] == sites[-1]  # nothing more: watch from head


def test_events_list_lines_are_the_watch_lines(env: dict[str, str]) -> None:
    """The fast renderer of the log equals the domain's public_event of the decoded event."""
    initialize(env)
    assert cli_inprocess(["tenants", "create", "acme"], env)[0] == 0
    _token(env, "acme")
    runtime = open_runtime(env)
    try:
        write_sites(runtime, 2)
        store = runtime.store
        notifications = store.recorder.select_notifications(start=0, limit=100)
        for n in notifications:
            expected = public_event(n.id, store.mapper.to_domain_event(n))
            assert msgspec.json.decode(render(n).line) == expected
        types = {n.topic for n in notifications}
        assert {"pki.created", "tenant.created", "token.created", "site.created"} <= types
    finally:
        runtime.close()
    code, out, _ = cli_inprocess(["events", "list", "--types", "site.*"], env)
    assert code == 0 and len(out.splitlines()) == 2
    assert all(not line.startswith(" ") and line.startswith('{"sequence":')
               for line in out.splitlines())


def test_a_tenant_lists_only_its_own_events(env: dict[str, str]) -> None:
    initialize(env)
    for tenant in ("acme", "beta"):
        assert cli_inprocess(["tenants", "create", tenant], env)[0] == 0
    acme = _token(env, "acme", "read-only")
    _token(env, "beta")
    code, out, err = cli_inprocess(["events", "list"], {**env, "BETTER_COMPUTE_TOKEN": acme})
    assert code == 0, err
    seen = _lines(out)
    assert [e["type"] for e in seen] == ["tenant.created", "token.created"]
    assert {e["tenantId"] for e in seen} == {"acme"}
    code, out, _ = cli_inprocess(["events", "list"], env)
    assert {e["tenantId"] for e in _lines(out)} == {"root", "acme", "beta"}


@pytest.mark.parametrize("argv, fragment", [
    (["events", "list", "--types", "node.*;x"], "not a glob"),
    (["events", "list", "--since", "-1"], "is not a sequence"),
    (["events", "list", "--since", "424242"], "beyond the head"),
    (["events", "list", "--limit", "0"], "at least 1"),
    (["api", "events.list", "limit:=5000"], "out of range"),
    (["projections", "rebuild", "nope"], "no projection 'nope'"),
])
def test_bad_input_is_refused_with_the_fix(env: dict[str, str], argv: list[str],
                                           fragment: str) -> None:
    initialize(env)
    runtime = open_runtime(env)
    try:
        head = log_sequences(runtime)[-1]
        code, _, err = cli_inprocess(argv, env)
        assert code != 0 and fragment in err
        assert log_sequences(runtime)[-1] == head  # nothing was written
        assert EventLog(runtime.store).head() == head
    finally:
        runtime.close()


def test_projections_status_and_rebuild(env: dict[str, str]) -> None:
    initialize(env)
    runtime = open_runtime(env)
    try:
        write_sites(runtime, 5)
        head = log_sequences(runtime)[-1]
    finally:
        runtime.close()
    code, out, err = cli_inprocess(["projections", "status"], env)
    assert code == 0, err
    (listings,) = [s for s in json.loads(out) if s["name"] == "listings"]
    assert listings["head"] == head and listings["lag"] == head - listings["position"]
    code, out, _ = cli_inprocess(["sites", "list", "--query", "length(@)"], env)
    assert out.strip() == "5"
    code, out, err = cli_inprocess(["projections", "rebuild", "listings"], env)
    assert code == 0, err
    (rebuilt,) = json.loads(out)
    assert rebuilt["position"] == head and rebuilt["lag"] == 0 and rebuilt["applied"] == head
    code, out, _ = cli_inprocess(["sites", "list", "--query", "length(@)"], env)
    assert out.strip() == "5"
    # Only a root administrator sees or rebuilds read models.
    member = {**env, "BETTER_COMPUTE_TOKEN": _token(env, "root", "member")}
    for argv in (["projections", "status"], ["projections", "rebuild"]):
        code, _, err = cli_inprocess(argv, member)
        assert code == 5 and "error [permission_denied]: " in err and "root administrator" in err
