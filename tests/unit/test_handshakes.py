"""``api/net.py`` ``Handshakes``: the TLS handshakes under way, counted per client address and
per process (the end-to-end test is tests/e2e/test_tls_handshakes.py)."""

from __future__ import annotations

from better_compute.api.net import Handshakes


def test_each_bound_refuses_past_it_and_an_end_frees_a_place() -> None:
    refused: list[str] = []
    handshakes = Handshakes(total=3, per_address=2, on_refused=refused.append)
    assert handshakes.begin("10.0.0.1") is None
    assert handshakes.begin("10.0.0.1") is None
    why = handshakes.begin("10.0.0.1")
    assert why is not None and "http.max_handshakes_per_address" in why
    assert handshakes.begin("10.0.0.2") is None
    why = handshakes.begin("10.0.0.3")
    assert why is not None and "http.max_handshakes" in why and "per_address" not in why
    assert refused == ["handshake_address", "handshake_server"]
    handshakes.end("10.0.0.1")
    assert handshakes.begin("10.0.0.3") is None  # a place in all, and 10.0.0.3 had none
    assert handshakes.under_way == 3
    assert handshakes.by_address == {"10.0.0.1": 1, "10.0.0.2": 1, "10.0.0.3": 1}
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        handshakes.end(address)
    assert handshakes.under_way == 0 and handshakes.by_address == {}


def test_zero_is_no_bound_and_a_unix_socket_counts_in_all_only() -> None:
    unbounded = Handshakes(total=0, per_address=0)
    assert all(unbounded.begin("10.0.0.1") is None for _ in range(5000))
    unix = Handshakes(total=2, per_address=1)
    assert unix.begin(None) is None and unix.begin(None) is None  # no address to count by
    assert unix.begin(None) is not None
    assert unix.by_address == {}
