"""``api/net.py`` ``Handshakes``: the TLS handshakes under way, counted per client address and
in all, the rule both listeners share (the end-to-end tests are tests/e2e/test_tls_handshakes.py
and test_edge_attacks.py)."""

from __future__ import annotations

import functools

from better_compute.api.net import Handshakes


def test_an_address_past_its_bound_is_refused_and_an_end_frees_its_place() -> None:
    refused: list[str] = []
    handshakes = Handshakes(total=5, per_address=2, on_refused=refused.append)
    first = handshakes.begin("10.0.0.1", lambda: None)
    assert first is not None and handshakes.begin("10.0.0.1", lambda: None) is not None
    assert handshakes.begin("10.0.0.1", lambda: None) is None
    assert refused == ["handshake_address"]
    assert handshakes.begin("10.0.0.2", lambda: None) is not None  # another address
    handshakes.end(first)
    handshakes.end(first)  # twice (a dropped handshake ends too): counted once
    assert handshakes.begin("10.0.0.1", lambda: None) is not None
    assert handshakes.count == 3
    assert handshakes.by_address == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_past_the_bound_in_all_the_oldest_is_dropped_for_the_newcomer() -> None:
    """Silent connections from many addresses, each under its own bound, fill the bound in
    all; a newcomer (the client that will finish its handshake) takes the oldest's place."""
    refused: list[str] = []
    dropped: list[int] = []
    handshakes = Handshakes(total=3, per_address=2, on_refused=refused.append)
    tickets = [handshakes.begin(f"10.0.0.{n}", functools.partial(dropped.append, n))
               for n in range(1, 4)]
    assert tickets[0] is not None and tickets[1] is not None and tickets[2] is not None
    newcomer = handshakes.begin("10.0.0.9", lambda: dropped.append(9))
    assert newcomer is not None
    assert dropped == [1] and refused == ["handshake_server"]
    assert handshakes.count == 3 and "10.0.0.1" not in handshakes.by_address
    handshakes.end(tickets[0])  # the dropped one's own end, later: nothing more to free
    assert handshakes.count == 3
    handshakes.end(tickets[1])
    assert handshakes.begin("10.0.0.8", lambda: dropped.append(8)) is not None
    assert dropped == [1]  # there was room: nothing dropped
    handshakes.begin("10.0.0.7", lambda: None)
    assert dropped == [1, 3]  # the oldest left, 10.0.0.3's, went next


def test_zero_is_no_bound_and_a_unix_socket_counts_in_all_only() -> None:
    unbounded = Handshakes(total=0, per_address=0)
    assert all(unbounded.begin("10.0.0.1", lambda: None) is not None for _ in range(5000))
    dropped: list[int] = []
    unix = Handshakes(total=2, per_address=1)
    for n in range(3):  # no address to count by: never refused, the oldest dropped
        assert unix.begin(None, functools.partial(dropped.append, n)) is not None
    assert dropped == [0] and unix.by_address == {} and unix.count == 2
