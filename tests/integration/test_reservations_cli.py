"""The tutorial's reservation commands, through the CLI in-process, on both backends."""

from __future__ import annotations

import json
import re

from tests.fleet import add_nodes, make_pool
from tests.support import cli_inprocess, initialize, open_runtime


def prepared(env: dict[str, str]) -> tuple[dict[str, str], str]:
    initialize(env)
    rt = open_runtime(env)
    try:
        pool = make_pool(rt.service)
        add_nodes(rt.service, pool, 2)
    finally:
        rt.close()
    return {**env, "BETTER_COMPUTE_TENANT": "root"}, pool


def cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    return cli_inprocess(list(argv), env)


def test_reserve_get_extend_release(env: dict[str, str]) -> None:
    env, pool = prepared(env)
    code, out, err = cli(env, "capacity", "--preview", "--pool", pool, "--gpus", "4", "--for", "2h")
    assert code == 0, err
    preview = json.loads(out)
    assert preview["fits"] is True and preview["hostResources"] == {"cpus": 104, "memoryGiB": 956}

    code, out, err = cli(env, "reserve", "--pool", pool, "--gpus", "4", "--for", "2h")
    assert code == 0, err
    key = re.search(r"idempotency key: (\S+)", err)
    assert key is not None
    first = json.loads(out)
    assert first["state"] == "placed" and first["key"] == key.group(1)

    code, out, err = cli(env, "reserve", "--pool", pool, "--gpus", "4", "--for", "2h",
                         "--key", key.group(1))
    assert code == 0 and json.loads(out)["id"] == first["id"]
    assert "idempotency key" not in err  # a given key is not new: nothing to print

    code, out, _ = cli(env, "reservations", "get", first["id"], "--query", "state")
    assert (code, out.strip()) == (0, "binding")  # it started: its node has the hold to make
    code, out, _ = cli(env, "reservations", "get", first["id"], "--query", "binding")
    assert (code, out.strip()) == (0, "null")
    code, out, _ = cli(env, "reservations", "list", "--query", "[].id")
    assert json.loads(out) == [first["id"]]

    code, out, err = cli(env, "extend", first["id"], "--by", "2h")
    assert code == 0, err
    assert json.loads(out)["request"]["for"] == "2h"  # the request stays as asked
    code, out, err = cli(env, "release", first["id"], "--query", "state")
    assert (code, out.strip()) == (0, "released"), err


def test_selectors_nvlink_start_and_cancel(env: dict[str, str]) -> None:
    env, pool = prepared(env)
    code, out, err = cli(env, "reserve", "--pool", pool, "--gpus", "8", "--for", "1h",
                         "--selector", "vramGiB >= 80", "--nvlink", "--model", "H100",
                         "--start", "+2h", "--query", "id")
    assert code == 0, err
    rsv = out.strip()
    code, out, err = cli(env, "release", rsv)
    assert code != 0 and "--cancel" in err
    code, out, err = cli(env, "release", rsv, "--cancel", "--query", "state")
    assert (code, out.strip()) == (0, "cancelled"), err


def test_bad_input_is_refused_with_the_fix_and_books_nothing(env: dict[str, str]) -> None:
    env, pool = prepared(env)
    for argv, words in [
        (["--for", "2 hours"], "is not a duration"),
        (["--selector", "vram >= 80"], "unknown attribute 'vram'"),
        (["--model", "A100"], "holds H100 GPUs"),
        (["--start", "tomorrow"], "neither +DURATION"),
        (["--gpus", "0"], "is not a GPU count"),
        (["--gpus", "17"], "no capacity for 17 GPUs"),
        (["--key", "bad key"], "not a valid idempotency key"),
    ]:
        base = {"--pool": pool, "--gpus": "4", "--for": "2h"}
        for flag, value in zip(argv[::2], argv[1::2], strict=True):
            base[flag] = value
        code, _, err = cli(env, "reserve", *[x for kv in base.items() for x in kv])
        assert code != 0 and words in err, (argv, err)
        assert "idempotency key: rsv-" not in err  # printed only once a request is accepted
    code, out, _ = cli(env, "reservations", "list")
    assert json.loads(out) == []
    code, _, err = cli(env, "capacity", "--pool", pool, "--gpus", "4")
    assert code != 0 and "add --preview" in err
    code, _, err = cli(env, "capacity", "--preview", "--pool", pool)
    assert code != 0 and "--gpus N and --for DURATION" in err


def test_a_prefix_of_a_flag_books_nothing(env: dict[str, str]) -> None:
    """``--gpu 1`` is not ``--gpus 1``: argparse's abbreviations are off, so a typo is a
    usage error (exit 2) that names the flag meant, and no reservation is made."""
    env, pool = prepared(env)
    code, out, err = cli(env, "reserve", "--pool", pool, "--gpu", "1", "--gpus", "1",
                         "--for", "1h")
    assert (code, out) == (2, "")
    assert "unrecognized arguments: --gpu 1 (did you mean --gpus?)" in err
    code, out, _ = cli(env, "reservations", "list")
    assert (code, json.loads(out)) == (0, [])
