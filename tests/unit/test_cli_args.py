"""Parsing what people type: api k=v, --quota, BETTER_COMPUTE_URL, secrets to files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from better_compute.api.net import is_loopback
from better_compute.cli.client import api_base, make_client, tls_context
from better_compute.cli.commands.api import parse_assignments
from better_compute.cli.commands.catalog import parse_quota
from better_compute.cli.files import write_new_secret
from better_compute.domain.errors import Conflict, InvalidInput


def test_api_values_are_strings_and_colon_equals_types_them() -> None:
    # httpie's convention: `siteId=1` is the string "1" (not the number 1, which the server
    # refuses); `name:=JSON` is how a number, boolean, list or object is written.
    assert parse_assignments([
        "siteId=1", "tenantId=acme", "flag=true", "reason=GPU 3 reseated", "eq=a=b", "empty=",
        "json={\"gpu\": 16}",
    ]) == {
        "siteId": "1", "tenantId": "acme", "flag": "true", "reason": "GPU 3 reseated",
        "eq": "a=b", "empty": "", "json": "{\"gpu\": 16}",
    }
    assert parse_assignments([
        "quota:={\"gpu\": 16}", "n:=16", "flag:=true", "none:=null", "list:=[1]", "quoted:=\"16\"",
        "eq:=\"a=b\"",
    ]) == {"quota": {"gpu": 16}, "n": 16, "flag": True, "none": None, "list": [1],
           "quoted": "16", "eq": "a=b"}


@pytest.mark.parametrize("item", ["tenantId", "=acme", "", ":=1"])
def test_api_params_must_be_key_value(item: str) -> None:
    with pytest.raises(InvalidInput, match="is not name=value or name:=JSON"):
        parse_assignments([item])


def test_a_typed_value_must_be_json() -> None:
    with pytest.raises(InvalidInput, match="the value after := is not JSON"):
        parse_assignments(["n:=sixteen"])


def test_quota_flags() -> None:
    assert parse_quota(["gpu=16"]) == {"gpu": 16}
    assert parse_quota(["gpu=16,cpu=4"]) == {"gpu": 16, "cpu": 4}  # the server refuses cpu
    assert parse_quota(["gpu=1", "gpu=2"]) == {"gpu": 2}


@pytest.mark.parametrize("item", ["gpu", "gpu=", "gpu=-1", "gpu=1.5", "gpu=x", "=4"])
def test_malformed_quota_flags(item: str) -> None:
    with pytest.raises(InvalidInput, match="--quota gpu=16"):
        parse_quota([item])


@pytest.mark.parametrize("url,base", [
    ("https://compute.example.com", "https://compute.example.com/api/compute"),
    ("https://compute.example.com/", "https://compute.example.com/api/compute"),
    ("https://compute.example.com/api/compute", "https://compute.example.com/api/compute"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080/api/compute"),
    ("http://localhost:8080", "http://localhost:8080/api/compute"),
    ("http://[::1]:8080", "http://[::1]:8080/api/compute"),
    ("http://127.8.9.10", "http://127.8.9.10/api/compute"),
])
def test_api_base(url: str, base: str) -> None:
    assert api_base(url) == base


@pytest.mark.parametrize("url", ["http://compute.example.com", "http://10.0.0.1",
                                 "http://[2001:db8::1]:80", "http://localhost.example.com"])
def test_plain_http_is_refused_unless_loopback(url: str) -> None:
    with pytest.raises(InvalidInput, match="plain http"):
        api_base(url)


@pytest.mark.parametrize("url", ["compute.example.com", "ftp://x", "https://", ""])
def test_urls_that_are_not_http(url: str) -> None:
    with pytest.raises(InvalidInput, match="is not an http"):
        api_base(url)


def test_loopback_hosts() -> None:
    assert is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("example.com") and not is_loopback("192.168.1.1")


def test_a_missing_or_broken_ca_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(InvalidInput, match="BETTER_COMPUTE_CA_FILE") as err:
        tls_context({"BETTER_COMPUTE_CA_FILE": str(missing)})
    assert str(missing) in str(err.value)
    missing.write_text("not a certificate\n")
    with pytest.raises(InvalidInput, match="not a readable PEM bundle"):
        tls_context({"BETTER_COMPUTE_CA_FILE": str(missing)})
    assert tls_context({}).verify_mode.name == "CERT_REQUIRED"


def test_a_url_makes_an_http_client_that_checks_it_first() -> None:
    with pytest.raises(InvalidInput, match="plain http"):
        make_client({"BETTER_COMPUTE_URL": "http://compute.example.com"})
    client = make_client({"BETTER_COMPUTE_URL": "https://compute.example.com"})
    try:
        assert type(client).__name__ == "HttpClient"
    finally:
        client.close()


def test_secrets_go_to_new_0600_files_only(tmp_path: Path) -> None:
    target = write_new_secret(tmp_path / "token", "biam_secret")
    assert target.read_text() == "biam_secret\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(Conflict, match="never overwritten"):
        write_new_secret(target, "biam_other")
    assert target.read_text() == "biam_secret\n"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Conflict):
        write_new_secret(link, "biam_other")
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(InvalidInput, match="does not exist"):
        write_new_secret(tmp_path / "no" / "token", "biam_x")
