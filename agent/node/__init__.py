"""`bcd node` (the session with the gateway, desired state, journal, status socket) and `bcd status`.

The package imports only the agent's own modules and ``better_compute.api.wire``.
docs/bcd.md describes both commands, the files under BCD_ROOT/var/lib/bcd and the
status schema.
"""
