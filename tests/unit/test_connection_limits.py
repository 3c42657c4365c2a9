"""ConnectionLimits' counting (api/http/listener.py); the e2e test drives a real server."""

from __future__ import annotations

import json

import pytest

from better_compute.api.http.listener import ConnectionLimits
from better_compute.api.settings import env_count
from better_compute.domain.errors import InvalidInput


def _error(refusal: bytes | None) -> tuple[str, dict[str, object]]:
    assert refusal is not None
    head, _, body = refusal.partition(b"\r\n\r\n")
    assert f"content-length: {len(body)}".encode() in head
    return head.split(b"\r\n", 1)[0].decode(), json.loads(body)["error"]["data"]


def test_each_address_and_the_process_are_bounded_and_places_come_back() -> None:
    seen: list[int] = []
    refused: list[str] = []
    limits = ConnectionLimits(total=3, per_address=2, on_open=seen.append,
                              on_refused=refused.append)
    assert limits.admit("10.0.0.1") is None and limits.admit("10.0.0.1") is None
    status, data = _error(limits.admit("10.0.0.1"))
    assert status == "HTTP/1.1 429 Too Many Requests"
    assert data == {"code": "rate_limited", "per": "address", "connections": 2, "limit": 2}
    assert limits.admit(None) is None  # a Unix socket: no address, the process's bound only
    status, data = _error(limits.admit("10.0.0.2"))
    assert status == "HTTP/1.1 503 Service Unavailable"
    assert data == {"code": "unavailable", "per": "server", "connections": 3, "limit": 3}
    assert refused == ["address", "server"]
    limits.release("10.0.0.1")
    assert limits.admit("10.0.0.2") is None
    for address in ("10.0.0.1", None, "10.0.0.2"):
        limits.release(address)
    assert (limits.count, limits.by_address) == (0, {})  # nothing kept for gone clients
    assert seen == [1, 2, 3, 2, 3, 2, 1, 0]


def test_zero_is_no_bound() -> None:
    limits = ConnectionLimits(total=0, per_address=0)
    assert all(limits.admit("10.0.0.1") is None for _ in range(10_000))


@pytest.mark.parametrize("text", ["-1", "1.5", "lots", "1e3", "9999999999"])
def test_a_count_setting_must_be_a_whole_number(text: str) -> None:
    with pytest.raises(InvalidInput, match="is not a whole number from 0"):
        env_count({"X": text}, "X", 5)


def test_a_count_setting_defaults_when_unset() -> None:
    assert env_count({}, "X", 5) == 5 and env_count({"X": " 0 "}, "X", 5) == 0
