"""bcd node's --metrics-listen and --log-format values (agent/node/command.py)."""

from __future__ import annotations

import socket

import pytest

from better_compute.agent.errors import BcdError
from better_compute.agent.node.command import _log_format, _metrics_address, _metrics_socket


@pytest.mark.parametrize(("text", "address"), [
    ("9400", ("127.0.0.1", 9400)),
    ("0.0.0.0:9400", ("0.0.0.0", 9400)),
    ("[::1]:9400", ("::1", 9400)),
    (None, None),
])
def test_a_port_alone_is_on_loopback(text: str | None, address: tuple[str, int] | None) -> None:
    assert _metrics_address(text) == address


@pytest.mark.parametrize("text", ["metrics", "host:", ":9400", "127.0.0.1:70000"])
def test_a_bad_address_names_the_flag(text: str) -> None:
    with pytest.raises(BcdError, match=r"--metrics-listen .* is not HOST:PORT \(for example 9400"):
        _metrics_address(text)


def test_log_format_from_config() -> None:
    assert _log_format(None) == "text" and _log_format("json") == "json"
    with pytest.raises(BcdError, match=r"\[log\] format of config.toml"):
        _log_format("xml")


def test_a_port_in_use_is_one_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(BcdError, match=rf"--metrics-listen 127.0.0.1:{port}: cannot listen "
                                           r"there \(Address already in use\); pick a free port"):
            _metrics_socket(("127.0.0.1", port))
    with _metrics_socket(("127.0.0.1", 0)) as sock:  # type: ignore[union-attr]
        assert sock.getsockname()[1] > 0
