"""The parts of `bcd node` that need no network: checks, journal, state, apply, backoff, URLs."""

from __future__ import annotations

import base64
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from better_compute.agent.errors import BcdError
from better_compute.agent.gpu import Gpu, HostFacts, Inventory
from better_compute.agent.node.apply import ApplyContext, apply_desired
from better_compute.agent.node.backoff import Backoff
from better_compute.agent.node.devices import bind_devices, unsupported
from better_compute.agent.node.diag import run_check
from better_compute.agent.node.journal import Journal
from better_compute.agent.node.render import render_status
from better_compute.agent.node.settings import parse_gateway_url, resolve_config_path
from better_compute.agent.node.state import NodeState, load_state, save_state
from better_compute.agent.paths import Paths
from better_compute.api.wire.sealing import sign_entry, verify_entry
from better_compute.api.wire.sections import Check

CFG = Path("/etc/bcd/config.toml")


def _inventory(n: int = 8, *, name: str = "NVIDIA H100 80GB HBM3", sick: dict[int, str] | None = None
               ) -> Inventory:
    sick = sick or {}
    gpus = [Gpu(index=i, uuid=f"GPU-{i}", name=name, healthy=i not in sick,
                health_reasons=[sick[i]] if i in sick else []) for i in range(n)]
    return Inventory(host=HostFacts(), gpus=gpus, source="fake")


def _check(count: int | None = 8, model: str | None = "H100") -> dict[str, object]:
    expect = {key: value for key, value in (("gpuCount", count), ("gpuModel", model)) if value}
    return {"kind": "diag.nvml", "expect": expect}


def _typed(check: dict[str, object]) -> Check:
    """A check as bcd reads it from the acceptance section (api/wire/sections.py)."""
    return msgspec.convert(check, Check)


# -- diag.nvml ---------------------------------------------------------------------


def test_diag_nvml_passes_on_the_expected_count_of_healthy_gpus_of_the_model() -> None:
    result = run_check(_typed(_check()), _inventory(), None)
    assert result.passed and result.message.startswith("8 healthy H100 GPUs, expected 8")


def test_diag_nvml_fails_naming_the_unhealthy_gpu() -> None:
    result = run_check(_typed(_check()), _inventory(sick={3: "xid-79"}), None)
    assert not result.passed
    assert "7 healthy H100 GPUs, expected 8" in result.message
    assert "GPU 3 (GPU-3) is unhealthy (xid-79)" in result.message


@pytest.mark.parametrize(("inventory", "why"), [
    (_inventory(name="NVIDIA A100-SXM4-80GB"), "not H100"),
    (_inventory(9), "9 healthy H100 GPUs, expected 8"),
    (_inventory(7), "7 healthy H100 GPUs, expected 8"),
])
def test_diag_nvml_fails_on_another_model_or_count(inventory: Inventory, why: str) -> None:
    result = run_check(_typed(_check()), inventory, None)
    assert not result.passed and why in result.message


def test_diag_nvml_without_expectations_and_unknown_checks() -> None:
    assert run_check(_typed(_check(None, None)), _inventory(2), None).passed
    assert not run_check(_typed(_check(None, None)), _inventory(0), None).passed
    unknown = run_check(Check(kind="diag.dcgm"), _inventory(), None)
    assert not unknown.passed and "does not know the check 'diag.dcgm'" in unknown.message
    broken = run_check(_typed(_check()), None, "fake GPU file x is not valid JSON")
    assert not broken.passed and "not valid JSON" in broken.message


# -- signing and the journal -------------------------------------------------------


def test_entries_verify_only_with_the_node_key_and_unaltered() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    payload_b64, signature_b64 = sign_entry(key, b'{"kind":"acceptance.result"}')
    assert verify_entry(key.public_key(), payload_b64, signature_b64) == \
        b'{"kind":"acceptance.result"}'
    other = ec.generate_private_key(ec.SECP256R1())
    assert verify_entry(other.public_key(), payload_b64, signature_b64) is None
    tampered = base64.b64encode(b'{"kind":"acceptance.result","passed":true}').decode()
    assert verify_entry(key.public_key(), tampered, signature_b64) is None
    assert verify_entry(key.public_key(), "not base64!", signature_b64) is None
    assert verify_entry(b"not a pem", payload_b64, signature_b64) is None
    edkey = ed25519.Ed25519PrivateKey.generate()
    assert verify_entry(edkey.public_key(), *sign_entry(edkey, b"x")) == b"x"


def test_the_journal_survives_a_reopen_and_a_torn_last_line(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, key)
    first = journal.append("acceptance.result/1", {"kind": "acceptance.result", "attempt": 1})
    second = journal.append("allocation.bound/alloc_1", {"kind": "allocation.bound"})
    assert (first.seq, second.seq) == (1, 2)
    assert journal.settle(1, "acked") and not journal.settle(1, "acked")
    with pytest.raises(ValueError, match="already written"):
        journal.append("acceptance.result/1", {})
    with path.open("ab") as handle:
        handle.write(b'{"seq": 3, "key": "allocation.bo')  # power lost mid-write
    reopened = Journal(path, key)
    assert [entry.seq for entry in reopened.unsettled()] == [2]
    assert reopened.has("acceptance.result/1") and reopened.next_seq == 3
    assert reopened.payload_of("acceptance.result/1") == {"kind": "acceptance.result",
                                                          "attempt": 1}
    assert verify_entry(key.public_key(), second.signed.payload, second.signed.signature)
    assert path.read_bytes().endswith(b"\n")  # the torn line is gone


def test_a_damaged_line_in_the_middle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"garbage\n" + b'{"settled": 1, "outcome": "acked"}\n')
    with pytest.raises(BcdError, match="damaged"):
        Journal(path, ec.generate_private_key(ec.SECP256R1()))


# -- state and apply ---------------------------------------------------------------


def test_state_of_another_node_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, NodeState(node_id="node_old", applied_generation=4))
    (tmp_path / "journal.jsonl").write_text("")
    fresh = load_state(path, "node_new")
    assert fresh.applied_generation == 0 and fresh.node_id == "node_new"
    assert (tmp_path / "state.json.node_old").exists()
    assert (tmp_path / "journal.jsonl.node_old").exists()
    assert load_state(tmp_path / "none.json", "node_new").applied_generation == 0


def test_applying_the_same_desired_state_twice_journals_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl", ec.generate_private_key(ec.SECP256R1()))
    state = NodeState(node_id="node_1", observed_generation=1, desired_sections={
        "acceptance": {"attempt": 1, "checks": [_check()]}})
    context = ApplyContext(node_id="node_1", epoch=1, time="2025-01-01T00:00:00Z",
                           inventory=_inventory(), source_error=None, paths=Paths(tmp_path),
                           devices=unsupported)
    written = apply_desired(state, journal, context)
    assert [entry.payload["kind"] for entry in written] == ["acceptance.result"]
    assert written[0].payload["nodeId"] == "node_1" and written[0].payload["passed"] is True
    assert state.applied_generation == 1 and state.sections["acceptance"].state == "passed"
    state.observed_generation = 2
    sick = ApplyContext(**{**context.__dict__, "inventory": _inventory(sick={0: "gpu-lost"})})
    assert apply_desired(state, journal, sick) == []  # attempt 1 ran already: not rerun
    assert state.applied_generation == 2 and state.sections["acceptance"].state == "passed"


def test_an_absent_devices_section_keeps_the_holds(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl", ec.generate_private_key(ec.SECP256R1()))
    state = NodeState(node_id="node_1", observed_generation=3, holds={"GPU-1": "alloc_1"})
    context = ApplyContext(node_id="node_1", epoch=1, time="t", inventory=None,
                           source_error="gone", paths=Paths(tmp_path), devices=unsupported)
    apply_desired(state, journal, context)
    assert state.holds == {"GPU-1": "alloc_1"}


# -- small things ------------------------------------------------------------------


def test_backoff_grows_to_its_cap_with_full_jitter_and_resets() -> None:
    backoff = Backoff(base=1.0, cap=8.0, random=lambda: 1.0)
    assert [backoff.next_delay() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    backoff.reset()
    assert backoff.next_delay() == 1.0
    quarter = Backoff(base=1.0, cap=8.0, random=lambda: 0.25)
    assert [quarter.next_delay() for _ in range(5)] == [0.25, 0.5, 1.0, 2.0, 2.0]
    assert Backoff(base=1.0, cap=8.0, random=lambda: 0.0).next_delay() == 0.0


def test_a_fleet_that_failed_together_spreads_over_the_whole_window() -> None:
    """Full jitter: after the same failures, a fleet's delays cover [0, the window] evenly,
    not its upper half (where every agent would come back within a few seconds)."""
    import random

    rng = random.Random(7)
    delays = []
    for _ in range(2000):
        agent = Backoff(base=0.5, cap=30.0, random=rng.random)
        for _ in range(4):  # four refusals in a row: the window is 0.5 s x 2^4 = 8 s
            agent.next_delay()
        delays.append(agent.next_delay())
    assert max(delays) <= 8.0
    assert sum(1 for d in delays if d < 2.0) > 400  # a quarter of the window, a quarter of them
    assert 3.6 < sum(delays) / len(delays) < 4.4


@pytest.mark.parametrize(("url", "host", "port"), [
    ("tls://gw.example.com:8443", "gw.example.com", 8443),
    ("https://gw.eu-1.example.com:8443", "gw.eu-1.example.com", 8443),
    ("https://gw.example.com", "gw.example.com", 443),
    ("tls://127.0.0.1:9000/", "127.0.0.1", 9000),
])
def test_gateway_urls_in_both_spellings(url: str, host: str, port: int) -> None:
    endpoint = parse_gateway_url(url, CFG)
    assert (endpoint.host, endpoint.port) == (host, port)


@pytest.mark.parametrize("url", [None, "", "tls://gw.example.com", "http://gw:80",
                                 "https://gw:8443/api", "gw.example.com:8443"])
def test_bad_gateway_urls_say_how_to_write_one(url: str | None) -> None:
    with pytest.raises(BcdError, match="tls://HOST:PORT"):
        parse_gateway_url(url, CFG)


def test_config_path_is_looked_up_under_bcd_root(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    assert resolve_config_path(None, paths) == paths.config
    assert resolve_config_path("/etc/bcd/config.toml", paths) == Path("/etc/bcd/config.toml")
    paths.config.parent.mkdir(parents=True)
    paths.config.write_text("")
    assert resolve_config_path("/etc/bcd/config.toml", paths) == paths.config


def test_text_status_shows_sections_gpus_and_holds() -> None:
    status = {
        "node": {"id": "node_1", "poolId": "pool_1", "siteId": "site_1", "tenantId": "root"},
        "session": {"state": "connected", "epoch": 3, "gateway": "tls://gw:8443",
                    "since": "2025-01-01T00:00:00Z"},
        "spec": {"appliedGeneration": 2, "observedGeneration": 3},
        "sections": {"acceptance": {"state": "passed", "message": "attempt 1: ok"}},
        "gpus": [msgspec.to_builtins(gpu) | {"heldBy": "alloc_9" if gpu.index == 1 else None}
                 for gpu in _inventory(2).gpus],
        "holds": {"GPU-1": "alloc_9", "GPU-gone": "alloc_8"},
        "gpuSource": {"name": "fake"}, "journal": {"entries": 2, "unacknowledged": 1},
    }
    lines = render_status(status).splitlines()
    assert lines[1] == "session  connected (epoch 3) to tls://gw:8443 since 2025-01-01T00:00:00Z"
    assert lines[2] == "spec     applied generation 2, observed generation 3"
    assert lines[3] == "section  acceptance: passed: attempt 1: ok"
    assert lines[4].startswith("gpu 0  GPU-0  NVIDIA H100 80GB HBM3  healthy  util n/a")
    assert lines[5].endswith("held by alloc_9") and "held by" not in lines[4]
    assert "GPU-gone  missing from the GPU source  held by alloc_8" in lines[6]
    assert lines[-1] == "journal  2 entries, 1 not yet acknowledged"


def test_a_failed_binding_is_journaled_once_and_never_retried(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "var/journal.jsonl", ec.generate_private_key(ec.SECP256R1()))
    assignment = {"allocationId": "alloc_9", "reservationId": "rsv_9", "gpus": ["GPU-absent"]}
    state = NodeState(node_id="node_1", observed_generation=1,
                      desired_sections={"devices": {"assignments": [assignment]}})
    context = ApplyContext(node_id="node_1", epoch=1, time="t", inventory=_inventory(),
                           source_error=None, paths=Paths(tmp_path), devices=bind_devices)
    written = apply_desired(state, journal, context)
    assert [(e.key, e.payload["reason"]) for e in written] == [
        ("allocation.failed/alloc_9", "device-missing")]
    assert state.sections["devices"].state == "failed" and state.holds == {}
    assert "GPU-absent" in state.sections["devices"].message
    state.observed_generation = 2
    assert apply_desired(state, journal, context) == []


def test_bound_assignments_are_held_until_they_leave_the_desired_state(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "var/journal.jsonl", ec.generate_private_key(ec.SECP256R1()))
    assignment = {"allocationId": "alloc_1", "reservationId": "rsv_1", "gpus": ["GPU-0", "GPU-1"]}
    state = NodeState(node_id="node_1", observed_generation=1,
                      desired_sections={"devices": {"assignments": [assignment]}})
    context = ApplyContext(node_id="node_1", epoch=1, time="t", inventory=_inventory(),
                           source_error=None, paths=Paths(tmp_path), devices=bind_devices)
    assert [e.key for e in apply_desired(state, journal, context)] == ["allocation.bound/alloc_1"]
    assert state.holds == {"GPU-0": "alloc_1", "GPU-1": "alloc_1"}
    assert apply_desired(state, journal, context) == []  # the same section again: nothing
    state.desired_sections = {"devices": {"assignments": []}}
    released = apply_desired(state, journal, context)
    assert [e.key for e in released] == ["allocation.released/alloc_1"]
    assert state.holds == {} and state.sections["devices"].state == "applied"


def test_a_section_that_does_not_fit_fails_alone_and_journals_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl", ec.generate_private_key(ec.SECP256R1()))
    state = NodeState(node_id="node_1", observed_generation=4, desired_sections={
        "acceptance": {"attempt": "one", "checks": [_check()]},
        "kubernetes": {"resourceName": "bcd.dev/gpu", "fromANewerServer": 1},
        "firmware": {"version": 2}})
    context = ApplyContext(node_id="node_1", epoch=1, time="t", inventory=_inventory(),
                           source_error=None, paths=Paths(tmp_path), devices=unsupported)
    assert apply_desired(state, journal, context) == []
    acceptance = state.sections["acceptance"]
    assert acceptance.state == "failed" and "$.attempt" in acceptance.message
    assert state.sections["kubernetes"].state == "applied"
    assert "bcd.dev/gpu" in state.sections["kubernetes"].message
    assert state.sections["firmware"].state == "unsupported"
    assert state.applied_generation == 4
