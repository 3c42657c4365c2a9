"""API token lifetimes: TTLs, rotation with a grace period, expiry as an event, last use.

Time is the service's clock, moved by the test (never slept for). The /watch
case runs the real ASGI app under uvicorn in this process, so the stream is
real HTTP while the clock stays the test's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import uvicorn

from better_compute.api.http.app import build_app
from better_compute.api.runtime import Runtime
from better_compute.api.services.tokens import TokenExpiry, lifetimes_from_env
from better_compute.api.store.actor import CONTROLLER_TOKENS
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.errors import Conflict, InvalidInput, PermissionDenied, Unauthenticated
from tests.support import Server, free_port, open_runtime, quick_init
from tests.watching import Reader, watch_env

T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def move(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def plane(env: dict[str, str]) -> Iterator[tuple[Runtime, Clock]]:
    rt = open_runtime(watch_env(env))
    clock = Clock()
    rt.service.clock = clock
    rt.root_token = quick_init(rt)  # type: ignore[attr-defined]
    rt.service.tenants_create(LOCAL_OPERATOR, "acme", None)
    try:
        yield rt, clock
    finally:
        rt.close()


def head(rt: Runtime) -> int:
    return int(rt.store.recorder.max_notification_id() or 0)


def events_of(rt: Runtime, token_id: str) -> list[dict[str, Any]]:
    from better_compute.api.store.eventlog import AuditFilter, EventLog, decode_lines, filter_for

    flt = filter_for(LOCAL_OPERATOR, "token.*", audit=AuditFilter(subject=token_id))
    return decode_lines(EventLog(rt.store).page(flt, 0, 1000).entries)


def test_a_token_lives_its_ttl_to_the_second_then_is_refused_like_a_revoked_one(
        plane: tuple[Runtime, Clock]) -> None:
    rt, clock = plane
    service = rt.service
    made = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "ci", ttl="30d")
    assert made["expiresAt"] == "2026-12-01T08:00:00Z" and made["ttl"] == "30d"
    default = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "default")
    assert default["expiresAt"] == "2027-01-30T08:00:00Z"  # 90d, the default
    clock.move(days=30, seconds=-1)
    assert service.authenticate(made["token"]).token_id == made["id"]
    clock.move(seconds=1)
    with pytest.raises(Unauthenticated, match="expired at 2026-12-01T08:00:00Z"):
        service.authenticate(made["token"])
    service.tokens_revoke(LOCAL_OPERATOR, default["id"])
    with pytest.raises(Unauthenticated):  # the same refusal, the same code
        service.authenticate(default["token"])
    listed = {t["id"]: t for t in service.tokens_list(LOCAL_OPERATOR, "acme")}
    assert listed[made["id"]]["state"] == "expired"  # by the clock, before any event
    assert listed[default["id"]]["state"] == "revoked"


def test_a_ttl_beyond_the_maximum_is_refused_and_changes_nothing(
        plane: tuple[Runtime, Clock]) -> None:
    rt, _ = plane
    before = head(rt)
    for bad in ("366d", "30s", "forever", "0d"):
        with pytest.raises(InvalidInput, match="--ttl"):
            rt.service.tokens_create(LOCAL_OPERATOR, "acme", "member", "x", ttl=bad)
    assert head(rt) == before


def test_lifetimes_come_from_the_servers_settings() -> None:
    custom = lifetimes_from_env({"BETTER_COMPUTE_TOKEN_TTL": "7d",
                                 "BETTER_COMPUTE_TOKEN_MAX_TTL": "30d",
                                 "BETTER_COMPUTE_TOKEN_ROTATION_GRACE": "10m"})
    assert (custom.default_ttl, custom.max_ttl, custom.grace) == (
        timedelta(days=7), timedelta(days=30), timedelta(minutes=10))
    with pytest.raises(InvalidInput, match="must lie between 1m and the maximum"):
        lifetimes_from_env({"BETTER_COMPUTE_TOKEN_TTL": "400d"})
    with pytest.raises(InvalidInput, match="ROTATION_GRACE"):
        lifetimes_from_env({"BETTER_COMPUTE_TOKEN_ROTATION_GRACE": "8d"})


def test_rotation_gives_a_new_secret_and_the_old_one_a_grace_period(
        plane: tuple[Runtime, Clock]) -> None:
    rt, clock = plane
    service = rt.service
    tokens = rt.services.tokens
    admin = service.tokens_create(LOCAL_OPERATOR, "acme", "admin", "acme admin")
    ci = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "ci", ttl="30d")
    acting = service.authenticate(admin["token"])
    rotated = tokens.rotate(acting, ci["id"], grace="2h", ttl=None)
    assert rotated["id"] != ci["id"] and rotated["token"] != ci["token"]
    assert (rotated["role"], rotated["name"], rotated["rotatedFrom"]) == ("member", "ci", ci["id"])
    assert rotated["ttl"] == "30d"  # the old token's lifetime
    assert rotated["previous"]["graceUntil"] == "2026-11-01T10:00:00Z"
    assert rotated["previous"]["state"] == "rotated"
    assert service.authenticate(rotated["token"]).token_id == rotated["id"]
    clock.move(hours=2, seconds=-1)
    assert service.authenticate(ci["token"]).token_id == ci["id"]  # still in its grace
    clock.move(seconds=1)
    with pytest.raises(Unauthenticated, match="expired"):
        service.authenticate(ci["token"])
    with pytest.raises(Conflict, match=f"already rotated to {rotated['id']}"):
        tokens.rotate(acting, ci["id"], grace=None, ttl=None)
    lapsed = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "lapsed", ttl="1m")
    clock.move(minutes=1)
    with pytest.raises(Conflict, match="expired"):
        tokens.rotate(acting, lapsed["id"], grace=None, ttl=None)
    # A token rotates itself; a member does not rotate another token.
    member = service.authenticate(rotated["token"])
    again = tokens.rotate(member, rotated["id"], grace="0s", ttl="1d")
    with pytest.raises(Unauthenticated):
        service.authenticate(rotated["token"])  # no grace
    with pytest.raises(Conflict, match="already rotated"):
        tokens.rotate(acting, rotated["id"], grace=None, ttl=None)
    with pytest.raises(PermissionDenied):
        tokens.rotate(service.authenticate(again["token"]), admin["id"], grace=None, ttl=None)
    types = [e["type"] for e in events_of(rt, ci["id"])]
    assert types == ["token.created", "token.rotated"]


def test_the_controller_records_each_end_once_dated_at_the_end(
        plane: tuple[Runtime, Clock]) -> None:
    rt, clock = plane
    service = rt.service
    short = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "short", ttl="1h")
    long = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "long", ttl="2h")
    expiry = TokenExpiry(rt.services.tokens)
    tick = expiry.tick
    assert tick() == []
    clock.move(minutes=90)
    assert tick() == [short["id"]]  # the nearest end came: scanned at once
    assert tick() == []
    ended = events_of(rt, short["id"])[-1]
    assert ended["type"] == "token.expired"
    assert ended["data"]["at"] == "2026-11-01T09:00:00Z"
    assert ended["actor"] == CONTROLLER_TOKENS
    assert [t["state"] for t in service.tokens_list(LOCAL_OPERATOR, "acme")
            if t["id"] in (short["id"], long["id"])] == ["expired", "active"]
    assert [e["type"] for e in events_of(rt, long["id"])] == ["token.created"]


def test_last_use_is_noted_in_memory_at_most_once_a_minute_and_never_as_an_event(
        plane: tuple[Runtime, Clock]) -> None:
    rt, clock = plane
    service = rt.service
    ci = service.tokens_create(LOCAL_OPERATOR, "acme", "member", "ci")
    before = head(rt)
    for _ in range(5):
        service.authenticate(ci["token"])
    assert service.token_use.flush() == 1
    clock.move(seconds=59)
    service.authenticate(ci["token"])
    assert service.token_use.flush() == 0  # within the minute: nothing new to write
    listed = [t for t in service.tokens_list(LOCAL_OPERATOR, "acme") if t["id"] == ci["id"]]
    assert listed[0]["lastUsedAt"] == "2026-11-01T08:00:00Z"
    clock.move(seconds=1)
    service.authenticate(ci["token"])
    assert service.token_use.flush() == 1
    listed = [t for t in service.tokens_list(LOCAL_OPERATOR, "acme") if t["id"] == ci["id"]]
    assert listed[0]["lastUsedAt"] == "2026-11-01T08:01:00Z"
    assert head(rt) == before  # no event for any of it


@contextlib.contextmanager
def http_server(rt: Runtime) -> Iterator[Server]:
    """The real app under uvicorn in a thread (plain HTTP, loopback), sharing ``rt``."""
    port = free_port()
    config = uvicorn.Config(build_app(rt), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=30)
        while not server.started:
            assert thread.is_alive() and datetime.now(UTC) < deadline, "uvicorn did not start"
            threading.Event().wait(0.02)
        yield Server(None, f"http://127.0.0.1:{port}", port)  # type: ignore[arg-type]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_an_open_watch_stream_ends_when_its_token_expires(env: dict[str, str]) -> None:
    rt = open_runtime(watch_env(env))
    clock = Clock()
    rt.service.clock = clock
    quick_init(rt)
    ci = rt.service.tokens_create(LOCAL_OPERATOR, "root", "read-only", "ci", ttl="1h")
    with http_server(rt) as server:
        reader = Reader(server, ci["token"], "", since=0)
        try:
            assert reader.status == 200
            reader.until(lambda line: line.get("type") == "token.created")
            clock.move(minutes=59)
            reader.until(lambda line: "heartbeat" in line)  # still open
            clock.move(minutes=1)
            last = reader.until(lambda line: "error" in line)[-1]
            assert last["error"]["code"] == "unauthenticated"
            assert "expired" in last["error"]["message"]
            with pytest.raises(AssertionError, match="ended"):
                reader.get(timeout=10)
        finally:
            reader.close()
    # rt.close() is the lifespan's (the app's runtime)
