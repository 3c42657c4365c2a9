"""Hypothesis strategies for JSON-RPC params, built from each method's params schema.

``params_for(method, ids)`` reads the method's JSON Schema (what
``rpc.discover`` publishes, from its msgspec Struct). Each property first gets
a plausible value chosen by its name and type (the ids of a populated store,
``1h`` for a duration, ``acme`` for a tenant id, a valid pool policy...), so
that calls get past the first checks; then most examples replace one field
(or several) with a hostile value of its kind: huge, control and bidi
strings, trailing newlines, durations and dates that overflow, numbers far
out of range, deep nesting, wrong types; and some send params that are not an
object at all, or carry an unknown field.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from better_compute.api.http import rpc
from tests.support import POLICY

_TEXT = ["", " ", "\x00", "a\x00b", "evil\u202etxt", "\u2066x\u2069", "line\nbreak", "\ud800",
         "\ufeff", "x" * 201, "x" * 5000, "y" * 70_000, "'; DROP TABLE x; --", "%s%n"]
HOSTILE: dict[str, list[Any]] = {
    "text": _TEXT,
    "id": ["acme\n", "root\n", "pool_" + "a" * 26, "pool_" + "a" * 26 + "\n", "tok_", "../root",
           "ACME", "a" * 41, "site_" + "Z" * 26, *_TEXT[:9]],
    "duration": ["999999999999d", "99999999999999999999s", "+3000000d", "0s", "-1h", "1e309",
                 "9" * 5000 + "d", "3651d", "1h\n", "\x001h"],
    "start": ["9999-12-31T00:00:00Z", "0001-01-01T00:00:00+00:00", "+3000000d", "+999999999d",
              "2031-01-01T00:00:00", "9999-12-31T23:59:59.999999+14:00", "now", "+1h\n"],
    "selector": ["(" * 2000 + "index == 1" + ")" * 2000, "not " * 1000 + "healthy == true",
                 "vramGiB >= " + "9" * 5000, " or ".join(["vramGiB >= 80"] * 25_000),
                 "vramGiB >= 1." + "5" * 400, "model == 'H100", "index in [" + "1," * 3000 + "1]"],
    "types": ["[", "node.[", "a]b[", "*[!", "x" * 500, ",".join(["a"] * 100), ["["] * 3],
    "number": [-1, 0, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, 10**30, -(10**30), 1.5, True],
    "object": [{"gpu": 10**30}, {"gpu": -1}, {"gpus": 1}, {"a": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]},
               {str(i): i for i in range(1500)}, {"acceptance": "x" * 70_000}, {}],
}
_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                  st.floats(allow_nan=False, allow_infinity=False))


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


ANY_JSON = st.one_of(
    _LEAF,
    st.recursive(_LEAF, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
        max_leaves=12),
    st.sampled_from([_nested(40), _nested(900), list(range(2000)), "z" * 70_000]),
)


def _kind(name: str, prop: dict[str, Any]) -> str:
    types = {o.get("type") for o in (prop.get("anyOf") or [prop])}
    if "integer" in types:
        return "number"
    if "object" in types:
        return "object"
    if name in ("duration", "ttl", "by"):
        return "duration"
    if name in ("start", "selector", "types"):
        return name
    if name.endswith("Id") or name in ("key", "role", "kind", "class", "gpuModel"):
        return "id"
    return "text"


def _plausible(name: str, prop: dict[str, Any], ids: dict[str, str]) -> Any:
    by_name = {
        "poolId": ids["pool"], "siteId": ids["site"], "nodeId": ids["node"],
        "reservationId": ids["rsv"], "joinTokenId": ids["jt"], "tokenId": ids["tok"],
        "tenantId": "acme", "toTenantId": "acme", "duration": "1h", "ttl": "1h", "by": "1h",
        "gpus": 1, "role": "member", "kind": "shared", "class": "metal-host", "gpuModel": "H100",
        "region": "eu-1", "quota": {"gpu": 4}, "policy": POLICY, "types": "site.*", "since": 0,
        "limit": 10, "start": "+1h", "maxUses": 2, "selector": "vramGiB >= 80", "model": "H100",
        "name": "a name", "reason": "a reason", "state": "placed", "sealed": "AAAA",
        "expectSerial": "SN-7701", "nvlink": False,
    }
    if name in by_name:
        return by_name[name]
    kinds = {o.get("type") for o in (prop.get("anyOf") or [prop])}
    if "null" in kinds:
        return None
    return {"integer": 1, "boolean": False, "object": {}, "array": []}.get(
        next(iter(kinds), ""), "x")


@st.composite
def params_for(draw: st.DrawFn, method: str, ids: dict[str, str]) -> Any:
    """Params for ``method``: plausible fields with hostile ones mixed in."""
    mode = draw(st.integers(0, 19))
    if mode == 0:
        return draw(ANY_JSON)  # not an object, or an object of anything
    schema = rpc.METHODS[method].schema()
    ref = schema.get("$ref", "").rsplit("/", 1)[-1]
    body: dict[str, Any] = schema.get("$defs", {}).get(ref, schema)
    props: dict[str, Any] = body.get("properties", {})
    params = {name: _plausible(name, prop, ids) for name, prop in props.items()}
    names = sorted(props)
    if names and mode <= 14:  # one field hostile (or of another type)
        count = 1 if mode <= 11 else draw(st.integers(2, max(2, len(names))))
        for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=count,
                                  unique=True)):
            kind = _kind(name, props[name])
            params[name] = draw(st.one_of(st.sampled_from(HOSTILE[kind]), ANY_JSON)
                                if draw(st.integers(0, 5)) == 0
                                else st.sampled_from(HOSTILE[kind]))
    if mode == 15 and names:  # a field missing
        params.pop(draw(st.sampled_from(names)))
    if mode == 16:
        params[draw(st.sampled_from(["colour", "tenantID", "__proto__", "x" * 300]))] = 1
    return params
