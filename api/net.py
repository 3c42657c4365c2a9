"""Network addresses: which hosts are loopback (plain HTTP and test shortcuts are allowed
there), and the bound of TLS handshakes under way that both listeners share (the API's,
api/http/listener.py, and the agents' gateway's, api/gateway/server.py)."""

from __future__ import annotations

import ipaddress
import itertools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("better_compute.net")
# Each logged at most once a minute (api/http/http_limits.py ClientNoise).
REFUSED = "TLS handshake refused before it began: %s has %d under way (at most %d, %s)"
DROPPED = ("the oldest TLS handshake under way was dropped for a new one: %d under way (at "
           "most %d, %s)")


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
    bounded (0: no bound): the connections open (api/http/listener.py
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
    """The TLS handshakes under way on one listener of a server process, the one rule of
    both listeners (the API's, api/http/listener.py; the agents' gateway's,
    api/gateway/server.py), counted from a connection's accept to its handshake's end:

    - at most ``per_address`` from one client address: one more from it is closed before
      its handshake (what fills that bound is the address's own connections);
    - at most ``total`` in all: one more drops the OLDEST under way (closed) and takes its
      place. So connections that never finish a handshake, from however many addresses,
      cannot keep out a client that finishes its own (a real one does in milliseconds; the
      flood would have to open ``total`` connections meanwhile).

    ``settings``: the names of the two bounds (in all, per address), for the log;
    ``on_refused`` hears each refusal's bound (``handshake_address``, ``handshake_server``).
    0 is no bound."""

    def __init__(self, total: int, per_address: int, *,
                 settings: tuple[str, str] = ("http.max_handshakes",
                                              "http.max_handshakes_per_address"),
                 on_refused: Callable[[str], None] | None = None) -> None:
        super().__init__(total, per_address)
        self.settings = settings
        self.on_refused = on_refused
        self._under_way: dict[int, tuple[str | None, Callable[[], object]]] = {}
        self._next = itertools.count()

    def begin(self, address: str | None, drop: Callable[[], object]) -> int | None:
        """A ticket for a handshake from ``address`` (``end`` it when the handshake ends);
        None when the address is at its bound (close the connection). ``drop`` ends this
        handshake should it become the oldest when the bound in all is reached."""
        if self.past(address) == "address":
            self._refused("handshake_address", REFUSED, address, self.held(address),
                          self.per_address, self.settings[1])
            return None
        if self.total and self.count >= self.total:
            oldest = next(iter(self._under_way))
            self._refused("handshake_server", DROPPED, self.count, self.total,
                          self.settings[0])
            self._under_way[oldest][1]()
            self.end(oldest)
        ticket = next(self._next)
        self._under_way[ticket] = (address, drop)
        self.add(address)
        return ticket

    def end(self, ticket: int) -> None:
        """The handshake is over (done, failed or dropped): its place is free."""
        entry = self._under_way.pop(ticket, None)
        if entry is not None:
            self.remove(entry[0])

    def _refused(self, per: str, message: str, *args: object) -> None:
        if self.on_refused is not None:
            self.on_refused(per)
        log.warning(message, *args)
