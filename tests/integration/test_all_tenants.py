"""-A/--all-tenants on the list commands (kubectl's spelling): every tenant's objects for
root-tenant tokens, with a TENANT column; a permission error for anyone else."""

from __future__ import annotations

import json

from better_compute.cli.main import build_parser
from better_compute.domain.access import LOCAL_OPERATOR
from tests.fleet import offered_pool
from tests.support import cli_inprocess, initialize, open_runtime
from tests.unit.test_docs_in_step import command_parsers

LISTS = sorted(path for path, parser in command_parsers(build_parser()).items()
               if "--all-tenants" in parser._option_string_actions)


def _two_tenants(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str], str]:
    """A pool offered to acme; root and acme each hold a reservation on it."""
    initialize(env)
    rt = open_runtime(env)
    try:
        pool = offered_pool(rt.service, nodes=2, gpus=8)
        token = rt.service.tokens_create(LOCAL_OPERATOR, "acme", "admin", "acme")["token"]
    finally:
        rt.close()
    root = {**env, "BETTER_COMPUTE_TENANT": "root"}
    acme = {**env, "BETTER_COMPUTE_TOKEN": token, "BETTER_COMPUTE_TENANT": "acme"}
    for who in (root, acme):
        code, _, err = cli_inprocess(["reserve", "--pool", pool, "--gpus", "1", "--for", "1h",
                                      "--wait", "0"], who)
        assert code == 0, err
    return root, acme, pool


def test_the_list_commands_take_all_tenants() -> None:
    assert {"reservations list", "nodes list", "tokens list", "join-tokens list",
            "pools list", "sites list"} <= set(LISTS)


def test_root_lists_every_tenants_reservations_with_a_tenant_column(env: dict[str, str]) -> None:
    root, _, _ = _two_tenants(env)
    code, out, err = cli_inprocess(["reservations", "list", "--query", "[].tenantId"], root)
    assert (code, json.loads(out)) == (0, ["root"]), err  # BETTER_COMPUTE_TENANT's only
    code, out, err = cli_inprocess(["reservations", "list", "-A", "--query", "[].tenantId"],
                                   root)
    assert (code, sorted(json.loads(out))) == (0, ["acme", "root"]), err
    code, out, err = cli_inprocess(["reservations", "list", "--all-tenants", "-o", "table"], root)
    header, *rows = out.splitlines()
    assert code == 0 and header.split()[:2] == ["TENANT", "ID"], err
    assert sorted(row.split()[0] for row in rows) == ["acme", "root"]
    code, out, err = cli_inprocess(["tokens", "list", "-A", "--query", "[].tenantId"], root)
    assert code == 0 and {"acme", "root"} <= set(json.loads(out)), err


def test_every_list_refuses_all_tenants_to_another_tenant(env: dict[str, str]) -> None:
    root, acme, _ = _two_tenants(env)
    for path in LISTS:
        code, out, err = cli_inprocess([*path.split(), "-A"], acme)
        assert (code, out) == (5, ""), (path, err)
        assert err.startswith("error [permission_denied]: only root-tenant tokens list every "
                              "tenant's"), (path, err)
        assert "leave out -A" in err
        code, out, err = cli_inprocess([*path.split(), "-A", "-o", "json"], root)
        assert code == 0, (path, err)
    code, _, err = cli_inprocess(["reservations", "list", "-A", "--tenant", "acme"], root)
    assert code == 2 and "not both" in err
