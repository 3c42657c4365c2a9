"""The agents' gateway (``serve --gateway-listen``): mutual TLS, one session per node.

Protocol: api/wire/gateway.py. Pieces: tls.py (the server's TLS context:
a serving-CA certificate, client certificates required from the node CA),
journal.py (verifying entries signed by the node key), renewal.py (renewing
a node certificate for the same key), session.py (one node's session),
server.py (the listener, the sessions by node, the wake-ups from the event
log and the writer of heartbeats and reports). docs/nodes.md describes it.
"""
