"""Log lines (api/wire/logs.py): their two formats, the request's fields, and no secret."""

from __future__ import annotations

import io
import json
import logging
import secrets
import uuid

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from better_compute.api.http.request_log import RequestFields, RequestRecord, recording
from better_compute.api.pki import MASTER_KEY_PREFIX, new_master_key
from better_compute.api.services.tokens import new_token_secret
from better_compute.api.wire import logs
from better_compute.domain.join_token import JOIN_TOKEN_PREFIX, make_secret
from better_compute.domain.token import TOKEN_PREFIX

WHEN = 1748779200.1234  # 2025-06-01T12:00:00.123Z


def test_text_and_json_lines() -> None:
    fields = {"request_id": "ab12", "tenant": "acme", "duration_ms": 1.5, "note": "two words"}
    text = logs.line("text", WHEN, "info", "better_compute.request", "rpc x ok", fields)
    assert text == ('2025-06-01T12:00:00.123Z INFO better_compute.request: rpc x ok '
                    'request_id=ab12 tenant=acme duration_ms=1.5 note="two words"')
    document = json.loads(logs.line("json", WHEN, "WARNING", "bcd node", "hello", fields))
    assert document == {"time": "2025-06-01T12:00:00.123Z", "level": "warning",
                        "logger": "bcd node", "message": "hello", **fields}


def test_the_secret_prefixes_are_the_projects() -> None:
    assert set(logs.SECRET_PREFIXES) == {TOKEN_PREFIX, JOIN_TOKEN_PREFIX, MASTER_KEY_PREFIX}


def test_no_secret_survives_a_line() -> None:
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()
    found = [new_token_secret(), make_secret(uuid.uuid4(), secrets.token_urlsafe(24)),
             new_master_key(), "hunter2-pw"]
    message = (f"token {found[0]}, join {found[1]} master={found[2]} "
               f"url postgresql://bc:{found[3]}@db/x and a key\n{key}")
    for log_format in logs.FORMATS:
        line = logs.line(log_format, WHEN, "error", "x", message, {"also": found[0]})
        for secret in [*found, "PRIVATE KEY", key.splitlines()[1]]:
            assert secret not in line, (log_format, secret[:10])
        assert "postgresql://bc:***@db/x" in line


def test_a_traceback_is_part_of_the_line_and_redacted() -> None:
    out = io.StringIO()
    logger = logging.getLogger("test.log_lines")
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.LineFormatter("json"))
    handler.addFilter(RequestFields())
    logger.addHandler(handler)
    secret = new_token_secret()
    try:
        with recording(RequestRecord("req-1", method="tokens.create")):
            try:
                raise ValueError(f"bad token {secret}")
            except ValueError:
                logger.exception("internal error (incident 1)")
    finally:
        logger.removeHandler(handler)
    document = json.loads(out.getvalue())
    assert document["message"].startswith("internal error (incident 1)\nTraceback")
    assert secret not in out.getvalue() and "ValueError: bad token ***" in document["message"]
    assert (document["request_id"], document["method"]) == ("req-1", "tokens.create")
