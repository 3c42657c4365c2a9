"""Network addresses: which hosts are loopback (plain HTTP and test shortcuts are allowed
there), and the TLS handshakes under way per client address (the API's listener,
api/http/tls_accept.py, and the agents' gateway, api/gateway/server.py)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback IP address (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Handshakes:
    """The TLS handshakes under way on one listener of a server process: in all and per
    client address. ``settings``: the names of the two bounds (in all, per address), for
    the refusal's words; ``on_refused`` hears each refusal's bound (``handshake_address``,
    ``handshake_server``)."""

    def __init__(self, total: int, per_address: int, *,
                 settings: tuple[str, str] = ("http.max_handshakes",
                                              "http.max_handshakes_per_address"),
                 on_refused: Callable[[str], None] | None = None) -> None:
        self.total = total
        self.per_address = per_address
        self.settings = settings
        self.on_refused = on_refused
        self.under_way = 0
        self.by_address: dict[str, int] = {}

    def begin(self, address: str | None) -> str | None:
        """None when a handshake from ``address`` may begin (and it is counted); else why
        not, for the log."""
        held = self.by_address.get(address, 0) if address is not None else 0
        if self.per_address and address is not None and held >= self.per_address:
            return self._refuse("handshake_address",
                                f"{address} has {held} under way (at most {self.per_address}, "
                                f"{self.settings[1]})")
        if self.total and self.under_way >= self.total:
            return self._refuse("handshake_server",
                                f"{self.under_way} under way in this server process (at most "
                                f"{self.total}, {self.settings[0]})")
        self.under_way += 1
        if address is not None:
            self.by_address[address] = held + 1
        return None

    def end(self, address: str | None) -> None:
        self.under_way -= 1
        if address is not None:
            held = self.by_address.pop(address, 1) - 1
            if held > 0:
                self.by_address[address] = held

    def _refuse(self, per: str, why: str) -> str:
        if self.on_refused is not None:
            self.on_refused(per)
        return why
