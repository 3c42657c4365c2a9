"""The web console in real headless Chromium, against a real `serve` with a simulated node.

One cluster per backend (the tutorial up to an adopted 8-GPU node with bcd running) and one
browser for the module; each test opens its own tabs (own sessions) and leaves every GPU
free again, so no test depends on another. What the page shows is compared with what the CLI
prints for the same questions: the console calls the same methods with the same token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from better_compute.cli.event_lines import summary as event_summary
from tests.browser import NARROW, WIDE, ConsolePage, chromium
from tests.cluster import Cluster, Operator, running_cluster
from tests.conftest import BACKENDS
from tests.support import POLICY, drop_schema, eventually, store_env

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2",
        "BETTER_COMPUTE_WATCH_HEARTBEAT": "0.5"}
MARKUP = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp(f"console-{request.param}")
    env = store_env(str(request.param), tmp)
    log = tmp / "serve.log"  # a file: a pipe nobody reads fills up over the module's tests
    try:
        with running_cluster(env, tmp, FAST, log_file=log) as c:
            c.join()
            c.start_agent(epoch=1)
            try:
                eventually(lambda: c.provision_state(c.node) == "adopted",
                           "the node is adopted")
            except AssertionError as slow:  # say why (it failed once, at the suite's start)
                raise AssertionError(f"{slow}: it is {c.provision_state(c.node)!r}; serve's "
                                     f"log ends {log.read_text()[-4000:]!r}") from None
            yield c
    finally:
        drop_schema(env)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def open_page(browser: Any, cluster: Cluster) -> Iterator[Callable[..., ConsolePage]]:
    """Tabs on the cluster's console; at the end, none may have run a script error or an alert."""
    opened: list[ConsolePage] = []

    def open_(width: int = WIDE) -> ConsolePage:
        page = ConsolePage(browser, cluster.server.url, width)
        opened.append(page)
        return page

    yield open_
    for page in opened:
        page.close()
    for page in opened:
        assert page.errors == [] and page.dialogs == [], (page.errors, page.dialogs)
        assert not [u for u in page.requested if "biam_" in u], "a token went into a URL"


def root_token(c: Cluster) -> str:
    return c.env["BETTER_COMPUTE_TOKEN"]


def tenant_operator(c: Cluster, tenant: str, role: str) -> Operator:
    token = c.cli("tokens", "create", "--role", role, "--tenant", tenant, "--query", "token")
    return Operator({**c.env, "BETTER_COMPUTE_TOKEN": token, "BETTER_COMPUTE_TENANT": tenant})


def reserve(operator: Operator, c: Cluster, gpus: int = 2) -> str:
    return operator.cli("reserve", "--pool", c.pool, "--gpus", str(gpus), "--for", "1h",
                        "--query", "id")


def release(operator: Operator, *reservations: str) -> None:
    for rsv in reservations:
        operator.cli("release", rsv)


def _number(value: Any) -> float | str:
    try:
        return float(value)
    except ValueError:
        return str(value)  # "unlimited"


def cli_capacity(c: Cluster, pool: str) -> dict[str, float | str]:
    """`capacity --pool P -o json`, flattened as the page names its fields."""
    doc = c.cli_json("capacity", "--pool", pool)
    out: dict[str, float | str] = {f"{name}.{k}": float(v)
                                   for name, resource in doc["resources"].items()
                                   for k, v in resource.items() if k != "unit"}
    out.update({f"nodes.{k}": float(v) for k, v in doc["nodes"].items()})
    out.update({f"quota.{k}": _number(v) for k, v in doc["quota"].items() if k != "tenantId"})
    return out


def page_capacity(page: ConsolePage, pool: str) -> dict[str, float | str]:
    return {k: _number(v) for k, v in page.fields(f'#pools-list [data-pool="{pool}"]').items()}


def row(page: ConsolePage, rsv: str, state: str | None = None) -> Any:
    suffix = f'[data-state="{state}"]' if state else ""
    return page.page.locator(f'#reservations-list tr[data-reservation="{rsv}"]{suffix}')


# ---------------------------------------------------------------------------- signing in


def test_sign_in_with_a_root_token_then_sign_out_forgets_it(cluster: Cluster,
                                                            open_page: Callable[..., ConsolePage]
                                                            ) -> None:
    page = open_page()
    page.open()
    page.page.fill("#token", "biam_not-a-token")
    page.page.click("#sign-in-form button[type=submit]")
    page.page.locator("#sign-in-error", has_text="unauthenticated").wait_for()

    page.sign_in(root_token(cluster))
    assert page.page.inner_text("#who-text") == "root · admin · root administrator"
    assert page.page.evaluate("sessionStorage.getItem('better-compute.token')") == \
        root_token(cluster)
    page.page.reload()  # the tab keeps its session: still signed in
    page.page.locator("#live[data-state=live]").wait_for()

    page.page.click("#sign-out")
    page.page.locator("#sign-in-form").wait_for()
    assert page.page.evaluate("sessionStorage.length") == 0
    assert page.page.evaluate("document.cookie") == ""
    assert page.page.locator("#view-pools").is_hidden()
    page.page.reload()
    page.page.locator("#token").wait_for()
    assert page.page.locator("#who").is_hidden()


# ---------------------------------------------------------------------------- the views


def test_the_capacity_view_shows_the_numbers_of_capacity_o_json(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    rsv = reserve(c, c, gpus=3)
    try:
        eventually(lambda: c.state(rsv) == "active", "the reservation is active")
        page = open_page()
        page.sign_in(root_token(c))
        expected = cli_capacity(c, c.pool)
        assert expected["gpu.allocated"] == 3
        eventually(lambda: page_capacity(page, c.pool) == cli_capacity(c, c.pool),
                   "the page shows capacity's numbers", timeout=10)
        assert set(page_capacity(page, c.pool)) == set(expected)  # every field, no other
    finally:
        release(c, rsv)
    # Live: the release reaches the page through /watch, and the numbers follow.
    eventually(lambda: page_capacity(page, c.pool) == cli_capacity(c, c.pool)
               and page_capacity(page, c.pool)["gpu.allocated"] == 0,
               "the page follows the release", timeout=10)


def test_a_reservation_made_with_the_cli_shows_in_the_feed_through_the_open_stream(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    """Live: the feed's one /watch stream carries the events as they happen (the page opens
    no other stream and reads nothing again for them), however long a loaded machine takes."""
    c = cluster
    page = open_page()
    page.sign_in(root_token(c))
    page.view("events")
    page.page.locator('#feed-status[data-state="live"]').wait_for(timeout=20_000)
    streams = [u for u in page.requested if "/events/watch" in u]
    rsv = reserve(c, c)
    try:
        page.page.locator(f'#feed li[data-subject="{rsv}"][data-type="reservation.placed"]'
                          ).wait_for(timeout=20_000)
        assert [u for u in page.requested if "/events/watch" in u] == streams
        page.page.fill("#feed-types", "node.*")  # filtered by type in the page
        assert page.page.locator(f'#feed li[data-subject="{rsv}"]').first.is_hidden()
        page.page.fill("#feed-types", "reservation.*")
        assert page.page.locator(f'#feed li[data-subject="{rsv}"]').first.is_visible()
        page.view("reservations")
        row(page, rsv).wait_for()
        assert page.page.inner_text(f'#reservations-list tr[data-reservation="{rsv}"] '
                                    '[data-field=gpus]') == "2"
    finally:
        release(c, rsv)
    page.view("events")
    page.page.locator(f'#feed li[data-subject="{rsv}"][data-type="reservation.released"]'
                      ).wait_for(timeout=20_000)
    assert [u for u in page.requested if "/events/watch" in u] == streams  # the same stream
    sequences = page.feed_sequences()
    assert sequences == sorted(set(sequences))  # once each, in order

    # Each event summarised by the rule `events watch` prints by (cli/event_lines.py), the
    # same text for every event of this cluster's log the page holds; its JSON one click away.
    lines = c.cli("events", "list", "-o", "json", "--since", str(sequences[0] - 1),
                  "--limit", "1000").splitlines()
    logged = {e["sequence"]: e for e in map(json.loads, lines)}
    shown = dict(page.page.eval_on_selector_all(
        "#feed li", "els => els.map(e => [Number(e.dataset.sequence),"
        " e.querySelector('[data-summary]').textContent])"))
    assert len(shown) > 10 and set(shown) <= set(logged)
    assert {n: text for n, text in shown.items() if text != event_summary(logged[n])} == {}
    assert shown[min(n for n, e in logged.items() if e["type"] == "reservation.placed"
                     and e["subject"] == rsv)] == f"2 GPUs on {c.node}"
    placed = f'#feed li[data-subject="{rsv}"][data-type="reservation.placed"]'
    assert page.page.locator(f"{placed} details.raw pre").is_hidden()
    page.page.click(f"{placed} details.raw > summary")
    raw = json.loads(page.page.inner_text(f"{placed} details.raw pre"))
    assert {k: raw[k] for k in ("sequence", "type", "subject", "data")} == \
        {k: logged[raw["sequence"]][k] for k in ("sequence", "type", "subject", "data")}


def shown_reservations(page: ConsolePage) -> list[str]:
    return list(page.page.eval_on_selector_all(
        "#reservations-list tr[data-reservation]", "rows => rows.map(r => r.dataset.reservation)"))


# Searching, filtering, sorting and addressing happen in the page, on what the API answered:
# once, on the first backend (capacity.history, which reads the store, runs on both below).
@pytest.mark.parametrize("cluster", BACKENDS[:1], indirect=True)
def test_search_filter_and_sort_reservations_and_nodes_kept_in_the_url(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    ended = reserve(c, c, gpus=1)
    release(c, ended)
    live = reserve(c, c, gpus=3)
    try:
        page = open_page()
        page.sign_in(root_token(c))
        page.view("reservations")
        row(page, live).wait_for()
        everything = shown_reservations(page)
        assert {ended, live} <= set(everything) and everything[0] == live  # newest first

        page.page.fill("#reservations-q", live[-8:].upper())  # any part of the id, any case
        eventually(lambda: shown_reservations(page) == [live], "the search finds one")
        assert page.page.inner_text("#reservations-count") == f"1 of {len(everything)} reservations"
        page.page.fill("#reservations-q", "")
        page.page.select_option("#reservations-state", "released")
        eventually(lambda: ended in shown_reservations(page) and live not in shown_reservations(page),
                   "the state filter keeps released ones")
        assert set(page.page.eval_on_selector_all(
            "#reservations-list tr[data-state]", "rows => rows.map(r => r.dataset.state)")) == \
            {"released"}
        page.page.select_option("#reservations-state", "live")
        page.page.select_option("#reservations-pool", c.pool)
        eventually(lambda: shown_reservations(page) == [live], "live ones of the pool")

        page.page.select_option("#reservations-state", "")
        page.page.click("#reservations-list button[data-sort=GPUs]")  # fewest GPUs first
        counts = page.page.eval_on_selector_all(
            "#reservations-list [data-field=gpus]", "els => els.map(e => Number(e.textContent))")
        assert counts == sorted(counts) and len(set(counts)) > 1
        assert page.page.get_attribute("#reservations-list th[aria-sort]", "aria-sort") == \
            "ascending"
        page.page.click("#reservations-list button[data-sort=GPUs]")  # most first
        counts = page.page.eval_on_selector_all(
            "#reservations-list [data-field=gpus]", "els => els.map(e => Number(e.textContent))")
        assert counts == sorted(counts, reverse=True)

        page.page.fill("#reservations-q", ended)
        url = page.page.evaluate("location.href")  # page.url follows replaceState late
        assert f"q={ended}" in url and "sort=-GPUs" in url and f"pool={c.pool}" in url
        page.page.reload()  # the list comes back as it was: the query is in the URL
        page.page.locator("#live[data-state=live]").wait_for()
        eventually(lambda: shown_reservations(page) == [ended], "the reload keeps the search")
        assert page.page.input_value("#reservations-q") == ended
        assert page.page.input_value("#reservations-pool") == c.pool

        page.view("nodes")
        node = f'#nodes-list [data-node="{c.node}"]'
        page.page.locator(node).wait_for()
        host = page.page.inner_text(f"{node} h2")
        page.page.fill("#nodes-q", host.upper())
        page.page.locator(node).wait_for()
        page.page.fill("#nodes-q", live)  # a node is found by the reservation it holds
        page.page.locator(node).wait_for()
        page.page.fill("#nodes-q", "no-such-node")
        page.page.locator("#nodes-list .empty").wait_for()
        page.page.fill("#nodes-q", "")
        page.page.select_option("#nodes-state", "cordoned")
        page.page.locator("#nodes-list .empty").wait_for()
        page.page.select_option("#nodes-state", "holding")
        page.page.locator(node).wait_for()
        assert "state=holding" in page.page.evaluate("location.href")
        page.page.select_option("#nodes-sort", "free")
        assert page.page.inner_text("#nodes-count") == "1 of 1 nodes"
    finally:
        release(c, live)


@pytest.mark.parametrize("cluster", BACKENDS[:1], indirect=True)
def test_every_object_has_a_url_that_opens_it_and_survives_a_reload(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    rsv = reserve(c, c, gpus=2)
    try:
        eventually(lambda: c.state(rsv) == "active", "the reservation is active")
        page = open_page()
        page.page.goto(f"{page.url}#/reservations/{rsv}")  # a link, opened before signing in
        page.page.fill("#token", root_token(c))
        page.page.click("#sign-in-form button[type=submit]")
        here = f'#view-object [data-object="{rsv}"]'
        page.page.locator(here).wait_for()
        assert page.page.inner_text("#object-title") == f"Reservation {rsv}"
        shown = page.fields(here)
        assert shown["state"] == "active" and shown["nodeId"] == c.node
        assert shown["binding.nodeId"] == c.node  # nested fields, not JSON in a cell
        assert shown["hostResources.cpus"] == c.cli("reservations", "get", rsv, "--query",
                                                   "hostResources.cpus")
        assert page.page.locator(f'{here} [data-type="reservation.placed"]').count() == 1
        page.page.locator(f"{here} [data-action=release]").wait_for()
        page.page.reload()
        page.page.locator(here).wait_for()
        assert page.page.url.endswith(f"#/reservations/{rsv}")

        page.page.click(f'{here} a[href="#/nodes/{c.node}"]')  # from the reservation to its node
        page.page.locator(f'#view-object [data-object="{c.node}"] [data-node="{c.node}"]').wait_for()
        assert page.page.get_attribute('#nav a[aria-current="page"]', "data-view") == "nodes"
        page.page.reload()
        page.page.locator(f'#view-object [data-object="{c.node}"]').wait_for()

        page.page.goto(f"{page.url}#/pools/{c.pool}")
        pool = f'#view-object [data-object="{c.pool}"]'
        page.page.locator(f'{pool} [data-chart="{c.pool}"] svg').wait_for()
        page.page.go_back()  # links are history entries: back is the node again
        page.page.locator(f'#view-object [data-object="{c.node}"]').wait_for()

        missing = "rsv_" + "a" * 26
        page.page.goto(f"{page.url}#/reservations/{missing}")
        page.page.locator("#object-body .error", has_text="not_found").wait_for()
    finally:
        release(c, rsv)


def chart_values(page: ConsolePage, pool: str, series: str, where: str = "#pools-list") -> list[int]:
    text = page.page.get_attribute(f'{where} [data-chart="{pool}"] [data-series={series}]',
                                   "data-values") or ""
    return [int(v) for v in text.split(",") if v]


def test_the_pool_card_charts_its_gpus_over_time_and_shows_the_quota(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    page = open_page()
    page.sign_in(root_token(c))
    chart = f'#pools-list [data-chart="{c.pool}"]'
    page.page.locator(f"{chart} svg").wait_for()
    before = chart_values(page, c.pool, "allocated")
    assert before and before[-1] == 0
    rsv = reserve(c, c, gpus=3)  # made in this test: the chart's "now" shows it
    try:
        eventually(lambda: chart_values(page, c.pool, "allocated")[-1] == 3,
                   "the chart shows the reservation", timeout=30)
        assert chart_values(page, c.pool, "available")[-1] == 5
        assert page.page.inner_text(f'{chart} [data-chart-field="allocated.now"]') == "3"
        history = c.cli_json("api", "capacity.history", f"poolId={c.pool}")
        assert history["window"] == "1d" and history["points"][-1]["allocated"] == 3
        assert len(chart_values(page, c.pool, "allocated")) == len(history["points"])

        page.page.click(f'{chart} button[data-window="7d"]')
        page.page.locator(f'{chart}[data-window="7d"] svg').wait_for()
        assert page.page.get_attribute(f'{chart} button[data-window="7d"]', "aria-pressed") == "true"
        week = chart_values(page, c.pool, "allocated")
        assert week[-1] == 3 and len(week) in (7 * 24 + 1, 7 * 24 + 2)  # now on an hour or not

        # The caller's quota on the card: the pool's owner has no limit, and sees its offers.
        assert page.fields(f'#pools-list [data-pool="{c.pool}"] .quota') == \
            {"quota.gpu": "unlimited", "quota.inUse": "0"}
    finally:
        release(c, rsv)
    eventually(lambda: chart_values(page, c.pool, "allocated", "#pools-list")[-1] == 0,
               "the chart follows the release", timeout=30)


def test_reserve_from_the_form_see_it_active_extend_and_release_it(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    page = open_page()
    page.sign_in(root_token(c))
    page.view("reservations")
    page.page.fill("#reserve-gpus", "2")
    page.page.fill("#reserve-duration", "30m")
    key = page.page.inner_text("#reserve-key")
    assert key.startswith("console-")

    # The preview's answer, every field of it: one a newer server adds (the earliest start)
    # shows without a change in the page.
    def add_a_field(route: Any) -> None:
        if json.loads(route.request.post_data or "{}").get("method") != "capacity.preview":
            route.continue_()
            return
        response = route.fetch()
        body = response.json()
        body["result"]["earliestStart"] = "2030-01-02T03:04:05Z"
        route.fulfill(response=response, json=body)

    page.page.route("**/api/compute/rpc", add_a_field)
    page.page.click("#reserve-preview")
    answer = "#reserve-answer"
    page.page.locator(f"{answer} [data-field=fits]").wait_for()
    # A summary a person reads, not the answer's keys; the answer itself one click away.
    shown = page.fields(answer)
    assert shown["fits"] == "fits now" and shown["nodeId"] == c.node
    assert shown["asked"].startswith("2 GPUs from ")
    assert shown["hostResources"].endswith(" GiB of memory")
    assert shown["quota"] == "unlimited"
    assert "earliestStart" not in page.page.inner_text(answer)
    page.page.click(f"{answer} details.raw > summary")
    raw = json.loads(page.page.inner_text(f"{answer} details.raw pre"))
    assert raw["fits"] is True and raw["nodeId"] == c.node and raw["gpus"] == 2
    assert raw["earliestStart"] == "2030-01-02T03:04:05Z"  # a field a newer server adds
    page.page.unroute("**/api/compute/rpc")

    page.page.click("#reserve-submit")
    rsv = page.page.locator("#reserve-created").inner_text()
    try:
        assert c.cli("reservations", "get", rsv, "--query", "key") == key
        assert page.page.inner_text("#reserve-key") != key  # a new key for the next one
        row(page, rsv, "active").wait_for(timeout=30000)

        end = c.cli("reservations", "get", rsv, "--query", "end")
        page.page.click(f'#reservations-list [data-action=extend][data-key="extend:{rsv}"]')
        page.page.fill("#confirm-field-by", "1h")
        page.page.click("#confirm-ok")
        page.page.locator("#confirm").wait_for(state="hidden")
        extended = c.cli("reservations", "get", rsv, "--query", "end")
        assert extended > end
        page.page.locator(f'#reservations-list tr[data-reservation="{rsv}"] [data-field=end] '
                          f'time[datetime="{extended}"]').wait_for()

        page.page.click(f'#reservations-list [data-action=release][data-key="release:{rsv}"]')
        page.page.click("#confirm-ok")
        row(page, rsv, "released").wait_for()
        assert c.state(rsv) == "released"
    finally:
        if c.state(rsv) != "released":
            release(c, rsv)


def test_root_cordons_and_uncordons_a_node(cluster: Cluster,
                                           open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    page = open_page()
    page.sign_in(root_token(c))
    page.view("nodes")
    node = f'#nodes-list [data-node="{c.node}"]'
    try:
        page.page.click(f"{node} [data-action=cordon]")
        page.page.fill("#confirm-field-reason", "swap a fan")
        page.page.click("#confirm-ok")
        page.page.locator(f"{node} [data-field=maintenance]", has_text="swap a fan").wait_for()
        assert c.gpu_capacity()["maintenance"] == 8
        page.view("pools")
        page.page.locator(f'[data-pool="{c.pool}"] [data-field="gpu.maintenance"]',
                          has_text="8").wait_for()
    finally:
        page.view("nodes")
        _click_or_say_why(page, c, f"{node} [data-action=uncordon]")
        page.page.click("#confirm-ok")
        page.page.locator(f"{node} [data-action=cordon]").wait_for()
    assert c.gpu_capacity()["maintenance"] == 0


def test_a_node_that_lists_other_gpus_shows_it_until_root_accepts(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    """A GPU replaced on the node (its fake source reports a new UUID): the card says
    `inventory mismatch` with what it lists; accepted, the chip goes. The node's GPUs are put
    back (a second repair, accepted too) for the other tests."""
    c = cluster
    page = open_page()
    page.sign_in(root_token(c))
    page.view("nodes")
    node = f'#nodes-list [data-node="{c.node}"]'
    original = c.machine.gpu_file.read_text()
    fleet = json.loads(original)
    fleet["gpus"][7]["uuid"] = "GPU-replaced-in-the-console"

    first = [g["uuid"] for g in json.loads(original)["gpus"]]

    def mismatched() -> bool:
        return c.cli_json("nodes", "get", c.node, "--query", "inventoryMismatch") is not None

    def lists_its_first_gpus_again() -> bool:
        pending = c.cli_json("nodes", "get", c.node, "--query", "inventoryMismatch") or {}
        return [g["uuid"] for g in pending.get("reported") or []] == first

    try:
        c.machine.gpu_file.write_text(json.dumps(fleet))
        chip = page.page.locator(f"{node} [data-field=inventory]")
        chip.wait_for()
        assert chip.inner_text() == "inventory mismatch"
        message = page.page.inner_text(f"{node} [data-field=inventory-message]")
        assert "GPU-replaced-in-the-console" in message and "accept-inventory" in message
        c.cli("nodes", "accept-inventory", c.node, "--reason", "console test")
        chip.wait_for(state="detached")
    finally:
        c.machine.gpu_file.write_text(original)
        if [g["uuid"] for g in c.cli_json("nodes", "get", c.node, "--query", "gpus")] != first:
            eventually(lists_its_first_gpus_again, "the node lists its first GPUs again")
            c.cli("nodes", "accept-inventory", c.node, "--reason", "console test, put back")
    assert not mismatched()


def _click_or_say_why(page: ConsolePage, c: Cluster, selector: str) -> None:
    """Click ``selector``; when it never comes, fail with what the page and the store show
    (the node's card, the live status, the page's errors, the node's maintenance as the CLI
    reads it), so that a failure under load says which side was behind."""
    target = page.page.locator(selector)
    try:
        target.wait_for(timeout=30_000)
    except Exception as exc:
        card = page.page.locator(f'[data-node="{c.node}"]').all_inner_texts()
        live = page.page.locator("#live").all_inner_texts()
        held = c.cli("nodes", "get", c.node, "--query", "maintenance")
        raise AssertionError(f"{selector} never came: card {card!r}, live {live!r}, "
                             f"errors {page.errors!r}, CLI maintenance {held!r}") from exc
    target.click()


# ---------------------------------------------------------------------------- who sees what


def test_a_tenant_sees_only_its_own_reservations(cluster: Cluster,
                                                 open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    c.cli("tenants", "create", "acme")
    c.cli("pools", "offer", c.pool, "--to", "acme", "--quota", "gpu=4")
    acme = tenant_operator(c, "acme", "member")
    theirs = reserve(c, c)
    ours = reserve(acme, c, gpus=1)
    try:
        others = [theirs, c.cli("reservations", "get", theirs, "--query", "allocationId")]
        page = open_page()
        page.sign_in(acme.env["BETTER_COMPUTE_TOKEN"])
        page.view("reservations")
        row(page, ours).wait_for()
        page.view("events")
        page.page.locator(f'#feed li[data-subject="{ours}"]').first.wait_for()
        page.view("nodes")
        page.page.locator("#nodes-list .empty").wait_for()
        page.view("pools")  # acme's quota on the pool card: 4 GPUs, the 1 it holds in use
        card = f'#pools-list [data-pool="{c.pool}"] .quota'
        page.page.locator(f'{card} [data-field="quota.inUse"]', has_text="1").wait_for()
        assert page.fields(card) == {"quota.gpu": "4", "quota.inUse": "1"}
        page.page.locator(f'#pools-list [data-chart="{c.pool}"] svg').wait_for()
        markup = page.text()
        assert ours in markup
        assert [i for i in others if i in markup] == []
        tenants = page.page.eval_on_selector_all("#feed li", "els => els.map(e => e.dataset.tenant)")
        assert set(tenants) == {"acme"}
    finally:
        release(acme, ours)
        release(c, theirs)


def test_a_read_only_token_sees_no_action_controls(cluster: Cluster,
                                                   open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    viewer = tenant_operator(c, "root", "read-only")
    rsv = reserve(c, c)
    try:
        page = open_page()
        page.sign_in(viewer.env["BETTER_COMPUTE_TOKEN"])
        page.view("reservations")
        row(page, rsv).wait_for()  # it sees every reservation, and may change none
        page.view("nodes")
        page.page.locator(f'#nodes-list [data-node="{c.node}"]').wait_for()
        assert page.page.locator("[data-action]").count() == 0
        assert page.page.locator("#reserve-form").count() == 0
        for view in ("pools", "nodes", "reservations", "events"):
            page.view(view)
            # Buttons that only change what the page shows (a chart's window, a sort) stay.
            assert page.page.locator(
                "main button:visible:not([data-window]):not(.sort)").count() == 0, view
        assert page.page.inner_text("#who-text") == "root · read-only"

        # A token revoked meanwhile signs the tab out at its next call, with the API's word.
        token_id = viewer.cli("api", "system.whoami", "--query", "tokenId")
        c.cli("tokens", "revoke", token_id)
        page.page.locator("#sign-in-error", has_text="unauthenticated").wait_for()
        assert page.page.locator("#sign-in-form").is_visible()
        assert page.page.evaluate("sessionStorage.length") == 0
    finally:
        release(c, rsv)


def test_a_site_named_like_markup_renders_as_text(cluster: Cluster,
                                                  open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    policy = c.machine.folder.parent / "markup-policy.json"
    policy.write_text(json.dumps(POLICY))
    site = c.cli("sites", "create", "--kind", "shared", "--region", "eu-9", "--name", MARKUP,
                 "--key", "site-markup", "--query", "id")
    pool = c.cli("pools", "create", "--site", site, "--class", "metal-host", "--gpu-model",
                 "H100", "--policy-file", str(policy), "--name", MARKUP, "--key", "pool-markup",
                 "--query", "id")
    page = open_page()
    page.sign_in(root_token(c))
    card = f'[data-pool="{pool}"]'
    page.page.locator(card).wait_for()
    assert page.page.inner_text(f"{card} h2") == MARKUP
    assert page.page.inner_text(f"{card} .site-name") == MARKUP
    page.view("events")
    page.page.locator(f'#feed li[data-subject="{site}"]').wait_for()
    assert MARKUP in page.page.inner_text(f'#feed li[data-subject="{site}"]')
    assert page.page.locator("img").count() == 0
    assert not [u for u in page.requested if u.endswith("/x")]
    assert page.dialogs == []  # no alert ran (checked again for every test at teardown)


def test_the_page_escapes_text_by_the_rule_of_domain_visible(
        cluster: Cluster, open_page: Callable[..., ConsolePage]) -> None:
    """dom.js's ``visible`` (every value the page shows goes through it) escapes exactly the
    characters domain/visible.py does, as the CLI and the logs show them."""
    from better_compute.domain.visible import visible

    sample = "".join(chr(c) for c in [*range(0, 0x3000), *range(0xFE00, 0x10000),
                                      *range(0xE0000, 0xE0080), 0x1F600]
                     if not 0xD800 <= c < 0xE000)
    page = open_page()
    page.open()
    shown = page.page.evaluate(
        "async (text) => (await import('/console/static/js/dom.js')).visible(text)", sample)
    assert shown == visible(sample)
    assert "\\x1b" in shown and "\\u202e" in shown and "\\x9b" in shown


def focused(page: ConsolePage) -> str:
    """What has the keyboard focus: its id, else its data-key, else its text."""
    return str(page.page.evaluate(
        "(() => { const e = document.activeElement;"
        " return e.id || e.dataset.key || e.textContent.trim(); })()"))


def test_everything_is_reachable_with_the_keyboard(cluster: Cluster,
                                                   open_page: Callable[..., ConsolePage]) -> None:
    c = cluster
    rsv = reserve(c, c)
    try:
        page = open_page()
        page.open()
        assert focused(page) == "token"  # the page opens with the focus in the token field
        page.page.keyboard.type(root_token(c))
        page.page.keyboard.press("Enter")
        page.page.locator("#live[data-state=live]").wait_for()
        reached = []
        for _ in range(40):  # through the pools view (links, tables, chart buttons), round
            page.page.keyboard.press("Tab")
            reached.append(focused(page))
            if reached[-1] == "Reservations":
                break
        assert {"sign-out", "Pools", "Nodes", "Reservations"} <= set(reached), reached
        page.page.keyboard.press("Enter")
        row(page, rsv).wait_for()
        reached = []
        for _ in range(40):
            page.page.keyboard.press("Tab")
            reached.append(focused(page))
            if reached[-1] == f"release:{rsv}":
                break
        assert {"reserve-pool", "reserve-gpus", "reserve-duration", "reserve-start",
                "reserve-preview", "reserve-submit", f"release:{rsv}"} <= set(reached), reached
        page.page.keyboard.press("Enter")  # the dialog opens on its button, Escape closes it
        page.page.locator("#confirm[open]").wait_for()
        assert focused(page) == "confirm-ok"
        page.page.keyboard.press("Escape")
        page.page.locator("#confirm").wait_for(state="hidden")
        assert focused(page) == f"release:{rsv}"
        assert c.state(rsv) == "active"
    finally:
        release(c, rsv)


# ---------------------------------------------------------------------------- looks


# How the page looks and reads does not depend on the store: once, on the first backend.
@pytest.mark.parametrize("cluster", BACKENDS[:1], indirect=True)
def test_every_view_at_both_widths_screenshots_and_axe(cluster: Cluster,
                                                       open_page: Callable[..., ConsolePage]
                                                       ) -> None:
    """Screenshots into build/console-screenshots (docs/console.md shows copies) and axe-core
    on every view and the action dialog: no serious or critical violation."""
    c = cluster
    rsv = reserve(c, c, gpus=3)
    violations: dict[str, list[dict[str, Any]]] = {}
    shots: list[Path] = []
    try:
        eventually(lambda: c.state(rsv) == "active", "the reservation is active")
        for width in (WIDE, NARROW):
            page = open_page(width)
            page.open()
            shots.append(page.shot("sign-in"))
            violations[f"sign-in@{width}"] = page.axe_violations()
            page.sign_in(root_token(c))
            waits = {"pools": f'[data-pool="{c.pool}"]', "nodes": f'[data-node="{c.node}"]',
                     "reservations": f'tr[data-reservation="{rsv}"][data-state=active]',
                     "events": f'#feed li[data-subject="{rsv}"]'}
            for view, selector in waits.items():
                page.view(view)
                page.page.locator(selector).first.wait_for()
                if view == "reservations":
                    page.page.click("#reserve-preview")
                    page.page.locator("#reserve-answer [data-field=fits]").wait_for()
                # The long lists as a person first sees them: one screen.
                shots.append(page.shot(view, full_page=view in ("pools", "nodes")))
                violations[f"{view}@{width}"] = page.axe_violations()
            # An object's page (a pool's is its card, checked above in the pools view).
            page.page.goto(f"{page.url}#/reservations/{rsv}")
            page.page.locator(f'#view-object [data-object="{rsv}"]').wait_for()
            shots.append(page.shot("reservation-page"))
            violations[f"reservation-page@{width}"] = page.axe_violations()
            page.view("reservations")
            page.page.click(f'#reservations-list [data-key="release:{rsv}"]')
            page.page.locator("#confirm[open]").wait_for()
            shots.append(page.shot("release-dialog", full_page=False))
            violations[f"dialog@{width}"] = page.axe_violations()
            page.page.click("#confirm-cancel")
    finally:
        release(c, rsv)
    assert {k: v for k, v in violations.items() if v} == {}
    assert all(p.stat().st_size > 10_000 for p in shots)
