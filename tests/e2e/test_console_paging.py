"""The console lists every reservation, though the server answers 1,000 a call.

reservations.list answers a page of at most 1,000 (docs/api.md); the console pages through
(api/http/console/static/js/main.js ``allReservations``). 1,001 reservations of the root
tenant, made in process on simulated adopted nodes, then a real ``serve`` and Chromium: the
newest one, which only the second page holds, shows (the view is newest first), and so do
all 1,001 rows.
"""

from __future__ import annotations

from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.browser import ConsolePage, chromium
from tests.fleet import add_nodes, make_pool
from tests.support import initialize, open_runtime, serve

MADE = 1001


def test_the_console_shows_reservations_past_the_first_page(env: dict[str, str]) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    try:
        pool = make_pool(runtime.service)
        add_nodes(runtime.service, pool, MADE // 8 + 1)
        rs = runtime.services.reservations
        made = [rs.create(OP, tenant_id=None, pool_id=pool, gpus=1, duration="1h")["id"]
                for _ in range(MADE)]
    finally:
        runtime.close()
    with chromium() as browser, serve(env) as server:
        page = ConsolePage(browser, server.url)
        page.sign_in(token)
        page.view("reservations")
        rows = page.page.locator("#reservations-list tr[data-reservation]")
        page.page.locator(f'#reservations-list tr[data-reservation="{made[-1]}"]').wait_for()
        assert rows.count() == MADE
        shown: Any = page.page.eval_on_selector_all(
            "#reservations-list tr[data-reservation]", "rows => rows.map(r => r.dataset.reservation)")
        assert sorted(shown) == sorted(made)
        assert page.errors == [] and page.dialogs == []
        page.close()
