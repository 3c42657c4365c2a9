"""Network addresses: which hosts are loopback (plain HTTP and test shortcuts are allowed there)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback IP address (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
