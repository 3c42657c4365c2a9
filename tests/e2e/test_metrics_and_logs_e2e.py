"""A tutorial run seen through /metrics and the logs (docs/metrics.md).

Real processes: `serve` with the gateway, `--metrics-listen` and JSON logs at debug, and a
joined machine whose `bcd node` serves its own metrics. Two tenants reserve; then the
scrape is parsed with prometheus-client's parser and compared with what the API answers:
capacity gauges equal `capacity -o json`, reservations by state equal `reservations list`,
the RPC counters grew by exactly the calls made, bcd lists its fake GPUs with the holding
allocation. Last, every log line of both processes is structured, request lines carry
their fields, and no token or key material is in any of them.
"""

from __future__ import annotations

import json
import ssl
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from better_compute.agent.gpu.fake import H100_MEMORY_MIB
from tests.cluster import Cluster, Operator, running_cluster
from tests.support import cli_inprocess, eventually, free_port
from tests.watching import Reader

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2",
        "BETTER_COMPUTE_WATCH_HEARTBEAT": "0.3"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
SECRET_MARKERS = ("biam_", "bcjt_", "bcmk1_", "PRIVATE KEY")


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str, **kwargs: Any) -> Samples:
    if url.startswith("http://"):  # the loopback listener: no TLS, so no CA file to load
        kwargs.setdefault("verify", False)
    answer = httpx.get(url, timeout=30, **kwargs)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(answer.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples if n == name]


def _check_capacity(samples: Samples, c: Cluster) -> None:
    capacity = c.cli_json("capacity", "--pool", c.pool)
    names = {"gpu": "better_compute_pool_gpus", "cpu": "better_compute_pool_cpus",
             "memory": "better_compute_pool_memory_gibibytes"}
    for resource, fields in capacity["resources"].items():
        shown = {labels["state"]: samples[(names[resource], frozenset(labels.items()))]
                 for labels in series(samples, names[resource]) if labels["pool"] == c.pool}
        assert shown == {k: v for k, v in fields.items() if k != "unit"}, resource
    nodes = {labels["state"]: samples[("better_compute_pool_nodes", frozenset(labels.items()))]
             for labels in series(samples, "better_compute_pool_nodes")
             if labels["pool"] == c.pool}
    assert nodes == capacity["nodes"]
    not_ready = [labels["reason"] for labels in series(samples, "better_compute_node_not_ready")
                 if labels["node"] == c.node]
    assert not_ready == ["cordoned"]  # adopted and connected, cordoned by the test


def _check_reservations(samples: Samples, c: Cluster, tenant: str) -> None:
    listed = Counter(r["state"] for r in c.cli_json("reservations", "list", "--tenant", tenant))
    counted = {labels["state"]: samples[("better_compute_reservations",
                                         frozenset(labels.items()))]
               for labels in series(samples, "better_compute_reservations")
               if labels["tenant"] == tenant and labels["pool"] == c.pool}
    assert counted == dict(listed), tenant


def _check_bcd(samples: Samples, c: Cluster, holds: Mapping[str, tuple[str, str]]) -> None:
    """``holds``: GPU uuid -> (allocation, reservation) for every held GPU."""
    documented = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    missing = sorted({n for n, _ in samples if f"`{n}`" not in documented})
    assert not missing, f"bcd metrics not in docs/metrics.md: {missing}"
    gpus = series(samples, "bcd_gpu_memory_total_bytes")
    assert len(gpus) == 8 and {g["gpu"] for g in gpus} == {str(i) for i in range(8)}
    for labels in gpus:
        assert (labels["node"], labels["pool"]) == (c.node, c.pool)
        assert labels["model"] == "NVIDIA H100 80GB HBM3"
        held = holds.get(labels["uuid"], ("", ""))
        assert (labels["allocation"], labels["reservation"]) == held, labels
        key = frozenset(labels.items())
        assert samples[("bcd_gpu_memory_total_bytes", key)] == H100_MEMORY_MIB * 1024 * 1024
        assert samples[("bcd_gpu_held", key)] == (1 if held[0] else 0)
        assert samples[("bcd_gpu_healthy", key)] == 1
        assert 30 <= samples[("bcd_gpu_temperature_celsius", key)] <= 35
        assert samples[("bcd_gpu_utilization_ratio", key)] == 0
    assert value(samples, "bcd_session_connected", node=c.node, pool=c.pool) == 1


def _json_lines(text: str, where: str) -> list[dict[str, Any]]:
    lines = []
    for raw in text.splitlines():
        if raw.strip():
            line = json.loads(raw)  # every line is one JSON object
            assert {"time", "level", "logger", "message"} <= set(line), (where, line)
            lines.append(line)
    return lines


def test_a_tutorial_run_through_metrics_and_logs(env: dict[str, str], tmp_path: Path) -> None:
    listener, bcd_port = free_port(), free_port()
    log_file = tmp_path / "serve.log"
    serve_args = ("--metrics-listen", f"127.0.0.1:{listener}", "--log-level", "debug",
                  "--log-format", "json")
    with running_cluster(env, tmp_path, FAST, serve_args=serve_args, log_file=log_file) as c:
        c.join()
        agent = c.start_agent(1, "--metrics-listen", str(bcd_port), "--log-format", "json")
        eventually(lambda: c.provision_state(c.node) == "adopted", "the node is adopted")
        c.cli("tenants", "create", "acme")
        c.cli("pools", "offer", c.pool, "--to", "acme", "--quota", "gpu=16")
        acme_token = c.cli_json("tokens", "create", "--tenant", "acme", "--role", "member")[
            "token"]
        acme = Operator({**c.env, "BETTER_COMPUTE_TOKEN": acme_token,
                         "BETTER_COMPUTE_TENANT": "acme"})
        kept = acme.cli_json("reserve", "--pool", c.pool, "--gpus", "2", "--for", "2h")
        ended = c.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h")
        for rsv in (kept, ended):
            def active(r: Any = rsv) -> bool:
                return c.state(r["id"]) == "active"

            eventually(active, "the reservation is active")
        assert c.cli("release", ended["id"], "--query", "state") == "released"
        c.cli("nodes", "cordon", c.node, "--reason", "metrics test")
        url = f"http://127.0.0.1:{listener}/metrics"

        def settled() -> bool:
            bcd = scrape(f"http://127.0.0.1:{bcd_port}/metrics")
            return sum(v for (n, _), v in bcd.items() if n == "bcd_gpu_held") == 2

        eventually(settled, "bcd holds only the kept reservation's GPUs")

        before = scrape(url)
        for _ in range(3):
            c.cli_json("capacity", "--pool", c.pool)
        code, _, _ = cli_inprocess(["tenants", "get", "nosuch"], c.env)
        assert code != 0
        after = scrape(url)
        for name in ("better_compute_rpc_requests_total",
                     "better_compute_rpc_duration_seconds_count"):
            grew = value(after, name, method="capacity.get", code="ok") - \
                value(before, name, method="capacity.get", code="ok")
            assert grew == 3, name
            assert value(after, name, method="tenants.get", code="not_found") - \
                value(before, name, method="tenants.get", code="not_found") == 1
        _check_capacity(after, c)
        _check_reservations(after, c, "acme")
        _check_reservations(after, c, "root")
        assert value(after, "better_compute_controllers_leader") == 1
        assert value(after, "better_compute_gateway_sessions") == 1
        assert value(after, "better_compute_store_up") == 1
        assert value(after, "better_compute_pool_info", pool=c.pool, site=c.cli_json(
            "pools", "get", c.pool)["siteId"], gpu_model="H100", tenant="root") == 1
        head = value(after, "better_compute_event_log_head")
        assert head > 0 and value(after, "better_compute_projection_position",
                                  projection="capacity") == head

        # The same on the API: any root-tenant token; another tenant's is refused.
        ca = ssl.create_default_context(cafile=c.env["BETTER_COMPUTE_CA_FILE"])
        api = f"{c.server.url}/metrics"
        on_api = scrape(api, verify=ca, headers={
            "authorization": f"Bearer {c.env['BETTER_COMPUTE_TOKEN']}"})
        assert value(on_api, "better_compute_pool_gpus", pool=c.pool, state="allocated") == 2
        assert httpx.get(api, verify=ca, headers={"authorization": f"Bearer {acme_token}"}
                         ).status_code == 403
        assert httpx.get(api, verify=ca).status_code == 401

        # An open /watch stream counts while it is open.
        reader = Reader(c.server, c.env["BETTER_COMPUTE_TOKEN"], c.env["BETTER_COMPUTE_CA_FILE"])
        reader.get()  # its first heartbeat: the stream runs
        assert value(scrape(url), "better_compute_watch_streams") == 1
        reader.close()
        eventually(lambda: value(scrape(url), "better_compute_watch_streams") == 0,
                   "the closed stream is no longer counted")

        alloc = c.cli_json("reservations", "get", kept["id"], "--tenant", "acme")
        holds = {device.removeprefix("bcd.dev/gpu="): (alloc["allocationId"], kept["id"])
                 for device in alloc["binding"]["cdiDevices"]}
        assert len(holds) == 2
        _check_bcd(scrape(f"http://127.0.0.1:{bcd_port}/metrics"), c, holds)

        secrets = [c.env["BETTER_COMPUTE_TOKEN"], acme_token,
                   (Path(env["BETTER_COMPUTE_DATA_DIR"]) / "master.key").read_text().strip()]
        c.machine.stop()
        bcd_out = agent.stdout.read() if agent.stdout else ""
        bcd_err = agent.stderr.read() if agent.stderr else ""
    server_log = log_file.read_text()
    for where, text in (("serve", server_log), ("bcd stdout", bcd_out), ("bcd stderr", bcd_err)):
        for secret in [*secrets, *SECRET_MARKERS]:
            assert secret not in text, (where, secret[:8])
    lines = _json_lines(server_log, "serve")
    requests = [line for line in lines if line["logger"] == "better_compute.request"]
    created = [r for r in requests if r["method"] == "reservations.create"]
    assert {r["tenant"] for r in created} == {"acme", "root"}
    assert all(r["code"] == "ok" and r["duration_ms"] > 0 and len(r["request_id"]) == 16
               and r["actor"].startswith("tok_") for r in created)
    assert any(r["method"] == "tenants.get" and r["code"] == "not_found" for r in requests)
    said = _json_lines(bcd_out, "bcd")  # what it said after "session connected (epoch 1)"
    assert said and all(line["logger"] == "bcd node" for line in said)
    assert any(line["message"].startswith("section devices: applied") for line in said)
