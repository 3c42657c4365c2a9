"""Network addresses: which hosts are loopback (plain HTTP and test shortcuts are allowed
there), and the TLS handshakes under way per client address (the API's listener,
api/http/tls_accept.py, and the agents' gateway, api/gateway/server.py)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback IP address (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def peer_host(peer: Any) -> str | None:
    """The client's address of a socket's peer name (without its port); None on a Unix
    socket (a path, or nothing)."""
    if isinstance(peer, tuple | list) and peer:
        return str(peer[0])
    return None


class AddressCounts:
    """What one server process holds, counted in all and per client address, each count
    bounded (0: no bound): the connections open (api/http/http_limits.py
    ``ConnectionLimits``) and the TLS handshakes under way (``Handshakes``)."""

    def __init__(self, total: int, per_address: int) -> None:
        self.total = total
        self.per_address = per_address
        self.count = 0
        self.by_address: dict[str, int] = {}

    def held(self, address: str | None) -> int:
        return self.by_address.get(address, 0) if address is not None else 0

    def past(self, address: str | None) -> str | None:
        """The bound one more from ``address`` would pass: ``address``, ``server``, or None."""
        if self.per_address and address is not None and self.held(address) >= self.per_address:
            return "address"
        if self.total and self.count >= self.total:
            return "server"
        return None

    def add(self, address: str | None) -> None:
        self.count += 1
        if address is not None:
            self.by_address[address] = self.held(address) + 1

    def remove(self, address: str | None) -> None:
        self.count -= 1
        if address is not None:
            held = self.by_address.pop(address, 1) - 1
            if held > 0:
                self.by_address[address] = held


class Handshakes(AddressCounts):
    """The TLS handshakes under way on one listener of a server process: in all and per
    client address. ``settings``: the names of the two bounds (in all, per address), for
    the refusal's words; ``on_refused`` hears each refusal's bound (``handshake_address``,
    ``handshake_server``)."""

    def __init__(self, total: int, per_address: int, *,
                 settings: tuple[str, str] = ("http.max_handshakes",
                                              "http.max_handshakes_per_address"),
                 on_refused: Callable[[str], None] | None = None) -> None:
        super().__init__(total, per_address)
        self.settings = settings
        self.on_refused = on_refused

    @property
    def under_way(self) -> int:
        return self.count

    def begin(self, address: str | None) -> str | None:
        """None when a handshake from ``address`` may begin (and it is counted); else why
        not, for the log."""
        past = self.past(address)
        if past is None:
            self.add(address)
            return None
        if self.on_refused is not None:
            self.on_refused(f"handshake_{past}")
        if past == "address":
            return (f"{address} has {self.held(address)} under way (at most "
                    f"{self.per_address}, {self.settings[1]})")
        return (f"{self.count} under way in this server process (at most {self.total}, "
                f"{self.settings[0]})")

    def end(self, address: str | None) -> None:
        self.remove(address)
