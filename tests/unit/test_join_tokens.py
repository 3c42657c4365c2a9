"""The JoinToken aggregate and its rules, in memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from better_compute.domain.errors import (
    Conflict,
    Expired,
    InvalidInput,
    PermissionDenied,
    Unauthenticated,
)
from better_compute.domain.events import event_type, public_event
from better_compute.domain.join_token import (
    JoinToken,
    check_binding,
    effective_state,
    join_token_hash,
    make_secret,
    parse_expect,
    parse_max_uses,
    parse_ttl,
    token_uuid_of_secret,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def mint(max_uses: int = 1, ttl: str = "2h", expect: dict[str, str] | None = None,
         ) -> tuple[JoinToken, str]:
    uuid = JoinToken.new_uuid("root", None)
    secret = make_secret(uuid, "r" * 43)
    token = JoinToken.mint(token_uuid=uuid, secret=secret, tenant_id="root", pool_id="pool_p",
                           site_id="site_s", ttl=parse_ttl(ttl), now=NOW, max_uses=max_uses,
                           expect=expect, key=None, fingerprint=None, created_by=None)
    return token, secret


@pytest.mark.parametrize(("text", "ok"), [
    ("1m", True), ("2h", True), ("24h", True), ("1d", True), ("1440m", True),
    ("59s", False), ("0m", False), ("25h", False), ("2d", False),
])
def test_ttl_is_one_minute_to_a_day(text: str, ok: bool) -> None:
    if ok:
        assert timedelta(minutes=1) <= parse_ttl(text) <= timedelta(hours=24)
    else:
        with pytest.raises(InvalidInput, match="1m to 24h"):
            parse_ttl(text)


def test_malformed_ttl_and_uses() -> None:
    with pytest.raises(InvalidInput, match="not a duration"):
        parse_ttl("two hours")
    for bad in (0, -1, 10_001, True):
        with pytest.raises(InvalidInput, match="--max-uses"):
            parse_max_uses(bad)


def test_expect_takes_one_identifier_normalized() -> None:
    assert parse_expect(None, None, None) is None
    assert parse_expect("SN-7701", None, None) == {"serial": "SN-7701"}
    assert parse_expect(None, "52-54-00-AB-CD-EF", None) == {"mac": "52:54:00:ab:cd:ef"}
    assert parse_expect(None, None, "4C4C4544-0000-1000-8000-000000000001") == {
        "uuid": "4c4c4544-0000-1000-8000-000000000001"}
    with pytest.raises(InvalidInput, match="only one"):
        parse_expect("SN-1", "52:54:00:ab:cd:ef", None)
    with pytest.raises(InvalidInput, match="not a MAC"):
        parse_expect(None, "52:54:00", None)
    with pytest.raises(InvalidInput, match="not a UUID"):
        parse_expect(None, None, "nope")
    with pytest.raises(InvalidInput, match="not a serial"):
        parse_expect(" ", None, None)


def test_binding_checks_and_hardware_keys() -> None:
    assert check_binding(None, "SN-1", "4C4C4544-0000-1000-8000-000000000001", []) == (
        "uuid:4c4c4544-0000-1000-8000-000000000001")
    assert check_binding(None, "SN-1", None, []) == "serial:SN-1"
    with pytest.raises(PermissionDenied, match=r"no trusted hardware key.*--expect-mac"):
        check_binding(None, None, None, ["52:54:00:ab:cd:ef"])
    assert check_binding({"mac": "52:54:00:ab:cd:ef"}, None, None,
                         ["52-54-00-AB-CD-EF"]) == "mac:52:54:00:ab:cd:ef"
    with pytest.raises(PermissionDenied, match=r"bound to serial SN-1.*reports serial SN-2"):
        check_binding({"serial": "SN-1"}, "SN-2", None, [])
    with pytest.raises(PermissionDenied, match="reports no serial"):
        check_binding({"serial": "SN-1"}, None, None, [])


def test_the_secret_names_the_token_and_only_its_hash_is_kept() -> None:
    token, secret = mint()
    assert secret.startswith("bcjt_") and token_uuid_of_secret(secret) == token.id
    assert token.secret_hash == join_token_hash(secret) and secret not in repr(vars(token))
    assert token.matches(secret) and not token.matches(secret + "x")
    for bad in ("", "biam_x", "bcjt_short.xyz", secret.replace(".", "-")):
        with pytest.raises(Unauthenticated):
            token_uuid_of_secret(bad)
    created = public_event(1, token.collect_events()[0])
    assert created["type"] == "joinToken.created" and created["subject"] == token.public_id
    assert "secretHash" not in created["data"] and created["data"]["maxUses"] == 1


def test_uses_then_exhausted() -> None:
    token, _ = mint(max_uses=2)
    token.use("node_a", "serial:SN-1", NOW)
    assert (token.state, token.uses) == ("active", 1)
    token.use("node_b", "serial:SN-2", NOW)
    assert (token.state, token.uses, token.node_ids) == ("exhausted", 2, ["node_a", "node_b"])
    with pytest.raises(PermissionDenied, match="used up"):
        token.use("node_c", "serial:SN-3", NOW)
    types = [event_type(e) for e in token.collect_events()]
    assert types == ["joinToken.created", "joinToken.used", "joinToken.used",
                     "joinToken.exhausted"]


def test_expiry_is_computed_then_recorded_lazily() -> None:
    token, _ = mint(ttl="1m")
    later = NOW + timedelta(minutes=1)
    assert token.to_doc(NOW)["state"] == "active" and token.to_doc(later)["state"] == "expired"
    assert effective_state("active", token.to_doc()["expiresAt"], later) == "expired"
    with pytest.raises(Expired):
        token.use("node_a", "serial:SN-1", later)
    assert token.mark_expired(later) and not token.mark_expired(later)
    assert token.state == "expired" and token.uses == 0


def test_revoke_once() -> None:
    token, _ = mint()
    token.revoke(NOW, "tok_x")
    with pytest.raises(Conflict):
        token.revoke(NOW, "tok_x")
    with pytest.raises(PermissionDenied, match="revoked"):
        token.use("node_a", "serial:SN-1", NOW)
