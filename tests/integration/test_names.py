"""Names wherever an id is taken: sites, pools and nodes by id or by name, on both backends.

The CLI in-process and the API (``better-compute api``) share one rule (api/services/names.py):
a well-formed id is that id; anything else is a name among the objects the caller sees; no
match is ``not_found``, several are ``ambiguous`` (exit 2) with the matches listed.
"""

from __future__ import annotations

import json
from pathlib import Path

from better_compute.benchmarks.fleet import build_node
from better_compute.domain.access import LOCAL_OPERATOR
from tests.fleet import make_pool
from tests.support import POLICY, cli_inprocess, initialize, open_runtime


def _cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    return cli_inprocess(list(argv), env)


def _fleet(env: dict[str, str]) -> tuple[dict[str, str], str, list[str]]:
    """The tutorial's names: pool pool-eu-1-h100 (its --key) on site site-pool-eu-1-h100,
    two adopted nodes gpu-sn-7701 and gpu-sn-7702, offered to acme."""
    initialize(env)
    rt = open_runtime(env)
    try:
        pool = make_pool(rt.service, key="pool-eu-1-h100")
        nodes = [build_node(pool, hostname=f"gpu-sn-770{i}") for i in (1, 2)]
        rt.service.store.save(*nodes, actor="local")
        rt.service.tenants_create(LOCAL_OPERATOR, "acme", None)
        rt.service.pools_offer(LOCAL_OPERATOR, pool, "acme", {"gpu": 8})
    finally:
        rt.close()
    return {**env, "BETTER_COMPUTE_TENANT": "root"}, pool, [n.public_id for n in nodes]


def test_pools_sites_and_nodes_by_name(env: dict[str, str], tmp_path: Path) -> None:
    env, pool, nodes = _fleet(env)
    code, out, err = _cli(env, "pools", "get", "pool-eu-1-h100", "--query", "id")
    assert (code, out.strip()) == (0, pool), err
    code, out, err = _cli(env, "reserve", "--pool", "pool-eu-1-h100", "--gpus", "1", "--for",
                          "1h", "--wait", "0")
    assert code == 0, err
    assert json.loads(out)["poolId"] == pool
    code, out, err = _cli(env, "capacity", "--pool", "pool-eu-1-h100",
                          "--query", "resources.gpu.allocated")
    assert (code, out.strip()) == (0, "1"), err
    code, out, err = _cli(env, "nodes", "get", "gpu-sn-7702", "--query", "id")
    assert (code, out.strip()) == (0, nodes[1]), err
    code, out, err = _cli(env, "nodes", "cordon", "gpu-sn-7701", "--query",
                          "maintenance.cordoned")
    assert (code, out.strip()) == (0, "true"), err
    code, out, err = _cli(env, "nodes", "list", "--pool", "pool-eu-1-h100", "--query", "[].id")
    assert sorted(json.loads(out)) == sorted(nodes), err
    code, site, err = _cli(env, "sites", "get", "site-pool-eu-1-h100", "--query", "id")
    assert code == 0 and site.startswith("site_"), err
    policy = tmp_path / "pool-policy.json"
    policy.write_text(json.dumps(POLICY))
    code, out, err = _cli(env, "pools", "create", "--site", "site-pool-eu-1-h100", "--class",
                          "metal-host", "--gpu-model", "H100", "--policy-file", str(policy),
                          "--name", "second", "--query", "siteId")
    assert (code, out.strip()) == (0, site.strip()), err


def test_the_api_takes_a_name_in_pool_id_and_a_retry_by_id_is_the_same(
        env: dict[str, str]) -> None:
    env, pool, _ = _fleet(env)
    args = ["gpus:=1", "duration=1h", "key=by-name", "--query", "id"]
    code, first, err = _cli(env, "api", "reservations.create", "poolId=pool-eu-1-h100", *args)
    assert code == 0, err
    code, again, err = _cli(env, "api", "reservations.create", f"poolId={pool}", *args)
    assert (code, again) == (0, first), err  # the key's fingerprint holds the id, not the name
    code, out, err = _cli(env, "api", "nodes.get", "nodeId=gpu-sn-7701", "--query",
                          "hardware.hostname")
    assert (code, out.strip()) == (0, "gpu-sn-7701"), err


def test_a_name_of_several_objects_is_ambiguous_and_lists_them(env: dict[str, str]) -> None:
    env, pool, nodes = _fleet(env)
    rt = open_runtime(env)
    try:
        twin = build_node(pool, hostname="gpu-sn-7701")
        rt.service.store.save(twin, actor="local")
    finally:
        rt.close()
    code, out, err = _cli(env, "nodes", "get", "gpu-sn-7701")
    assert (code, out) == (2, "")
    assert err.startswith("error [ambiguous]: 'gpu-sn-7701' names 2 nodes you see: ")
    assert nodes[0] in err and twin.public_id in err and "use the id" in err
    code, _, err = _cli(env, "api", "nodes.cordon", "nodeId=gpu-sn-7701")
    assert code == 2 and "error [ambiguous]" in err
    code, out, _ = _cli(env, "nodes", "get", nodes[0], "--query", "maintenance.cordoned")
    assert out.strip() == "false"  # the ambiguous cordon changed nothing


def test_names_are_looked_up_among_what_the_caller_sees(env: dict[str, str]) -> None:
    env, pool, _ = _fleet(env)
    rt = open_runtime(env)
    try:
        hidden = make_pool(rt.service, key="not-offered")  # root's, never offered to acme
        token = rt.service.tokens_create(LOCAL_OPERATOR, "acme", "admin", "t")["token"]
    finally:
        rt.close()
    acme = {**env, "BETTER_COMPUTE_TOKEN": token, "BETTER_COMPUTE_TENANT": "acme"}
    code, out, err = _cli(acme, "pools", "get", "pool-eu-1-h100", "--query", "id")
    assert (code, out.strip()) == (0, pool), err  # offered to acme
    code, _, err = _cli(acme, "pools", "get", "not-offered")
    assert code == 3 and "no pool named 'not-offered'" in err, err
    code, _, err = _cli(acme, "nodes", "get", "gpu-sn-7701")  # root's node: not acme's
    assert code == 3 and "no node named 'gpu-sn-7701'" in err, err
    code, out, err = _cli(acme, "sites", "get", "site-pool-eu-1-h100", "--query", "id")
    assert code == 0 and out.startswith("site_"), err  # the site of a pool offered to acme
    code, _, err = _cli(acme, "sites", "get", "site-not-offered")
    assert code == 3, err
    code, _, err = _cli(env, "pools", "get", "pool_notanid")
    assert code == 2 and "is not a pool id" in err  # a mistyped id says what ids look like
    assert hidden


def test_name_and_hostname_columns(env: dict[str, str]) -> None:
    env, _, nodes = _fleet(env)
    code, out, _ = _cli(env, "pools", "list", "-o", "table")
    assert code == 0
    header, row = out.splitlines()[:2]
    assert "NAME" in header and "pool-eu-1-h100" in row
    code, out, _ = _cli(env, "nodes", "list", "-o", "wide")
    assert code == 0 and "HOSTNAME" in out.splitlines()[0]
    assert any(nodes[0] in line and "gpu-sn-7701" in line for line in out.splitlines())


def test_completion_names_lists_ids_and_names_of_what_the_caller_sees(
        env: dict[str, str]) -> None:
    env, pool, nodes = _fleet(env)
    code, out, err = _cli(env, "completion", "--names", "pool")
    assert (code, out.split()) == (0, [pool, "pool-eu-1-h100"]), err
    code, out, err = _cli(env, "completion", "--names", "node")
    assert code == 0 and out.split() == [*nodes, "gpu-sn-7701", "gpu-sn-7702"], err
    code, out, err = _cli(env, "completion", "--names", "site")
    assert code == 0 and out.split()[1:] == ["site-pool-eu-1-h100"], err
    code, _, err = _cli(env, "completion", "bash", "--names", "pool")
    assert code == 2 and "not both" in err
