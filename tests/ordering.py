"""The order the suite runs in under pytest-xdist: the longest tests first, spread evenly.

``scripts/test`` runs pytest-xdist's worksteal on every core. worksteal deals the collected
tests in contiguous chunks (one a worker), then lets an idle worker steal the end of a busy
one's queue. In collection order the longest end-to-end tests (the outage, the tutorial) came
last and one worker ran them alone while the other waited. This orders the collection so that
each worker's chunk holds an even share of the long tests, longest first, and ends with the
many short ones that stealing evens out: greedy longest-processing-time placement, with each
chunk exactly as long as the one worksteal deals.

Only the order changes: every test still runs, and none depends on another's order (the
suite's rule). ``SECONDS`` are measured figures (``scripts/test --durations=0``, a test's
parametrizations averaged); a test not in it weighs what its folder's tests usually do. A
stale figure only makes the spread less even. Tests that share a module-scoped fixture stay
together, so it is built once a worker.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Sequence

import pytest

# Tests that take 4 s or more (their setup, call and teardown), from a 2-core run.
SECONDS: dict[str, float] = {
    # scripts/ha's layout (module-scoped: the three run in one worker, the first sets it up)
    "tests/e2e/test_high_availability.py::test_a_rolling_restart_of_the_three_replicas_loses_no_call": 104,
    "tests/e2e/test_high_availability.py::test_the_standby_takes_over_when_the_primarys_host_is_lost": 44,
    # Measured on the shared machine at load 5-16 (2026-12-03): the quiet figures are lower.
    "tests/e2e/test_history.py::test_a_short_schedule_with_faults_breaks_no_invariant": 72,
    "tests/e2e/test_kill_restart.py::test_acknowledged_creates_survive_sigkill_of_a_worker_and_of_serve_mid_load": 36,
    "tests/e2e/test_history.py::test_the_checker_reports_the_invariant_a_mutation_breaks": 25,
    "tests/integration/test_isolation.py::test_watch_streams_only_the_events_each_tenant_lists": 6,
    "tests/e2e/test_high_availability.py::test_scripts_ha_status_names_each_part_and_its_role": 8,
    "tests/e2e/test_store_outage.py::test_serve_rides_out_a_15s_then_a_60s_postgresql_outage": 111,
    "tests/e2e/test_tutorial.py::test_the_readme_and_the_tutorial_run_as_written": 52,
    "tests/e2e/test_join_e2e.py::test_agent_side_refusals_write_nothing_and_spend_no_token": 43,
    "tests/integration/test_projections_crash.py::test_killed_catch_ups_leave_a_read_model_equal_to_a_rebuild": 33,
    "tests/e2e/test_tutorial_foundation.py::test_tutorial_in_process_without_a_url": 33,
    "tests/e2e/test_console_browser.py::test_every_view_at_both_widths_screenshots_and_axe": 29,
    "tests/e2e/test_store_outage.py::test_serve_rides_out_a_full_disk_under_its_sqlite_store": 28,
    "tests/e2e/test_hostile_memory.py::test_the_server_stays_under_300_mb_under_hostile_load": 26,
    "tests/e2e/test_node_retirement_e2e.py::test_drain_remove_force_and_rejoin": 21,
    "tests/e2e/test_node_inventory_e2e.py::test_a_node_cannot_take_another_nodes_gpus_and_a_repair_needs_the_operator": 21,
    "tests/e2e/test_join_e2e.py::test_join_the_server_with_bcd_as_the_tutorial_writes_it": 19,
    "tests/e2e/test_connection_errors_e2e.py::test_wrong_settings_say_what_to_fix_and_exit_2": 10,
    "tests/e2e/test_cli_views_e2e.py::test_names_and_watch_against_a_real_server": 8,
    "tests/e2e/test_queue_e2e.py::test_earliest_start_moves_forward_and_the_queue_places_by_itself": 17,
    "tests/e2e/test_kubernetes_e2e.py::test_kubernetes_workers_get_exactly_the_gpus_they_reserved": 17,
    "tests/e2e/test_spine_e2e.py::test_a_release_while_bcd_is_away_completes_when_it_returns": 16,
    "tests/e2e/test_serve_workers.py::test_fifty_clients_on_three_workers_never_double_book_nor_exceed_the_quota": 16,
    "tests/e2e/test_leader_takeover.py::test_the_surviving_replica_takes_over_the_controllers": 16,
    "tests/e2e/test_serve_as_a_service.py::test_refusals_name_the_setting": 15,
    "tests/e2e/test_node_lifecycle_e2e.py::test_join_adopt_status_capacity_kill_and_reconnect": 15,
    "tests/e2e/test_watch_replicas.py::test_an_event_written_through_one_replica_reaches_a_watcher_on_another": 14,
    "tests/integration/test_store_setup.py::test_processes_opening_an_initialized_store_together_all_succeed": 13,
    "tests/e2e/test_serve_workers_metrics.py::test_a_killed_worker_stops_the_run_and_the_next_run_counts_from_zero": 13,
    "tests/e2e/test_serve_as_a_service.py::test_serve_reads_its_settings_from_the_config_file": 12,
    "tests/integration/test_gpu_claims.py::test_a_gpu_of_another_node_is_refused_until_that_node_lets_it_go": 12,
    "tests/e2e/test_tutorial_foundation.py::test_tutorial_against_serve_over_tls": 11,
    "tests/e2e/test_metrics_and_logs_e2e.py::test_a_tutorial_run_through_metrics_and_logs": 11,
    "tests/e2e/test_kill_restart.py::test_same_key_same_object_after_sigkill": 11,
    "tests/e2e/test_watch_stream.py::test_a_watcher_10000_events_behind_catches_up_in_order": 10,
    "tests/e2e/test_events_watch_cli.py::test_kill_9_during_a_stream_then_the_cli_resumes_without_gap_or_duplicate": 10,
    "tests/unit/test_earliest_search.py::test_the_search_answers_the_true_earliest_start_and_a_free_slot": 9,
    "tests/integration/test_store_setup.py::test_processes_opening_a_new_store_together_all_succeed": 9,
    "tests/integration/test_rpc_fuzz.py::test_fuzz_every_method": 9,
    "tests/e2e/test_node_lifecycle_e2e.py::test_seven_healthy_gpus_stay_adopting_until_fixed_and_adopted": 9,
    "tests/e2e/test_run_script.py::test_scripts_run_prints_the_console_the_token_command_and_the_ca": 10,
    "tests/e2e/test_console_resume.py::test_the_feed_resumes_without_gap_or_duplicate_after_the_server_restarts": 9,
    "tests/e2e/test_console_browser.py::test_sign_in_with_a_root_token_then_sign_out_forgets_it": 9,
    "tests/e2e/test_bcd_single_file.py::test_the_shipped_bcd_runs_the_whole_node_path_on_a_bare_python": 9,
    "tests/e2e/test_bcd_single_file.py::test_the_build_is_one_verifiable_file": 9,
    "tests/integration/test_bcd_toolkit_process.py::test_nvidia_json_before_the_hold_and_again_after_a_driver_upgrade": 8,
    "tests/e2e/test_serve_workers_metrics.py::test_serve_starts_a_worker_per_core_by_default": 8,
    "tests/e2e/test_serve_workers_metrics.py::test_a_scrape_on_any_worker_counts_the_calls_of_every_worker": 8,
    "tests/e2e/test_serve_workers.py::test_a_worker_that_dies_stops_the_server_with_status_1": 8,
    "tests/e2e/test_serving_keys.py::test_serving_keys_go_once_read_and_stale_ones_of_dead_processes_at_start": 8,
    "tests/e2e/test_postgres_urls.py::test_the_server_follows_the_primary_to_a_promoted_standby": 8,
    "tests/unit/test_earliest_search.py::test_the_index_bounds_are_never_later_than_a_nodes_earliest_start": 7,
    "tests/e2e/test_spine_e2e.py::test_reserve_bind_use_release": 7,
    "tests/e2e/test_postgres_urls.py::test_serve_on_postgresql_with_verify_full": 7,
    "tests/e2e/test_install_script.py::test_install_script_verifies_installs_configures_and_joins": 7,
    "tests/e2e/test_events_watch_cli.py::test_resume_after_a_server_restart_yields_exactly_the_missed_events": 7,
    "tests/e2e/test_bcd_single_file_kubelet.py::test_the_single_files_plugin_registers_with_the_kubelet": 7,
    "tests/integration/test_capacity_rollup_property.py::test_rollup_equals_recomputation_from_aggregates": 6,
    "tests/e2e/test_serve_workers_metrics.py::test_systemd_hears_ready_and_stopping_from_the_main_process": 6,
    "tests/unit/test_function_length.py::test_no_function_is_over_the_limit_without_a_reason": 5,
    "tests/unit/test_codec_roundtrip.py::test_any_value_round_trips_through_the_transcoder": 5,
    "tests/unit/test_bookings_aggregate.py::test_no_gpu_is_ever_double_booked": 5,
    "tests/integration/test_store_pool_wait.py::test_an_exhausted_pool_answers_unavailable_after_one_wait": 5,
    "tests/e2e/test_kubernetes_e2e.py::test_reserve_kubernetes_is_refused_on_a_pool_without_the_policy": 5,
    "tests/e2e/test_hostile_memory.py::test_a_refused_body_stops_being_received": 5,
    "tests/e2e/test_edge_attacks.py::test_pipelined_requests_that_are_never_read_hold_bounded_memory": 10,
    "tests/e2e/test_console_browser.py::test_root_cordons_and_uncordons_a_node": 5,
    "tests/e2e/test_console_browser.py::test_reserve_from_the_form_see_it_active_extend_and_release_it": 5,
    "tests/e2e/test_console_browser.py::test_everything_is_reachable_with_the_keyboard": 5,
    "tests/e2e/test_console_browser.py::test_a_read_only_token_sees_no_action_controls": 5,
    "tests/integration/test_systemd_notify.py::test_bcd_node_tells_systemd_when_it_is_ready_and_when_it_stops": 4,
    "tests/integration/test_bcd_node_process.py::test_bcd_node_runs_serves_status_and_stops_on_sigterm": 4,
    "tests/e2e/test_console_browser.py::test_a_tenant_sees_only_its_own_reservations": 4,
    "tests/e2e/test_console_browser.py::test_search_filter_and_sort_reservations_and_nodes_kept_in_the_url": 4,
    "tests/e2e/test_console_browser.py::test_every_object_has_a_url_that_opens_it_and_survives_a_reload": 4,
}
BY_FOLDER = {"e2e": 5.0, "integration": 0.5, "unit": 0.05}


def weight(item: pytest.Item) -> float:
    base = item.nodeid.split("[", 1)[0]
    if base in SECONDS:
        return SECONDS[base]
    parts = base.split("/")
    return BY_FOLDER.get(parts[1], 0.5) if len(parts) > 2 else 0.5


def _block(item: pytest.Item) -> str:
    """Items that share a module-scoped fixture (the same instance) form one block."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return item.nodeid
    shared = sorted(name for name, defs in info.name2fixturedefs.items()
                    if defs and defs[-1].scope in ("module", "package", "class"))
    if not shared:
        return item.nodeid
    params = getattr(getattr(item, "callspec", None), "params", {})
    return f"{item.path}|" + "|".join(f"{n}={params.get(n)!r}" for n in shared)


def spread(items: Sequence[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` as ``workers`` chunks of worksteal's sizes, each with an even share of the
    weight, longest first; blocks and ties keep their collection order."""
    blocks: dict[str, list[pytest.Item]] = {}
    for item in items:
        blocks.setdefault(_block(item), []).append(item)
    ordered = sorted(blocks.values(), key=lambda b: -sum(weight(i) for i in b))  # stable
    sizes, left = [], len(items)
    for i in range(workers):  # what worksteal's first schedule sends each worker
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    bins: list[list[pytest.Item]] = [[] for _ in range(workers)]
    heap = [(0.0, i) for i in range(workers)]  # (weight so far, bin)
    for block in ordered:
        skipped = []
        while True:
            load, i = heapq.heappop(heap)
            if len(bins[i]) + len(block) <= sizes[i] or not heap:
                break
            skipped.append((load, i))
        bins[i].extend(block)
        heapq.heappush(heap, (load + sum(weight(x) for x in block), i))
        for entry in skipped:
            heapq.heappush(heap, entry)
    placed = [item for b in bins for item in b]
    return placed


@pytest.hookimpl(trylast=True)  # after pytest's own grouping by higher-scoped parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        items[:] = spread(items, workers)
