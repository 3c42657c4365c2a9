"""The gateway's TLS context: mutual TLS, node certificates only.

The server certificate comes from the serving CA (bcd pins it, as for the
API); client certificates are REQUIRED and must chain to the node CA. The
certificate and key go through files only for the moment
``load_cert_chain`` reads them (the ssl module reads nothing else).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path

from better_compute.api import pki, run_files


def server_context(bundle: pki.PkiBundle, hostnames: list[str], run_dir: Path) -> ssl.SSLContext:
    cert_pem, key_pem = pki.issue_serving_certificate(bundle, hostnames)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    # bcd never resumes a session (each connection is a full handshake whose certificate the
    # gateway reads): no TLS 1.3 tickets, which cost each handshake about a third of its
    # CPU on both sides for nothing (docs/performance.md, "A fleet on one server").
    context.num_tickets = 0
    context.load_verify_locations(cadata=pki.pem(bundle.node_ca_cert))
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Named after this process, so a start removes what a kill -9 right here left
    # (api/run_files.py).
    with tempfile.TemporaryDirectory(dir=run_dir, prefix=f"gateway-{os.getpid()}-") as tmp:
        cert_path, key_path = Path(tmp) / "gateway.crt", Path(tmp) / "gateway.key"
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            run_files.write_private(path, data)
        context.load_cert_chain(cert_path, key_path)
    return context
