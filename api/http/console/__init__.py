"""``GET /console``: the web console, static files shipped in this package (docs/console.md).

The page is plain HTML, CSS and JavaScript modules from ``static/``: no build
step, no template, nothing rendered from data on the server. In the browser it
calls the same JSON-RPC API and ``/events/watch`` stream as the CLI, with the
user's token in the Authorization header, so it adds no authentication surface
and sees exactly what the token may see.

Every answer here carries a strict Content-Security-Policy (scripts and styles
from this origin only, no inline script or style, no framing, forms that never
submit natively), so data that reached the page could not run even if it were
ever inserted as markup (the page builds its DOM with ``textContent`` only).
Names are matched against a fixed pattern and resolved inside ``static/``:
nothing else is ever read.
"""

from __future__ import annotations

import re
from importlib import resources

import anyio
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

CONSOLE_PATH = "/console"
STATIC_PREFIX = f"{CONSOLE_PATH}/static/"
# Lower-case path segments that start with a letter or digit, one dot: the extension.
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}(?:/[a-z0-9][a-z0-9_-]{0,63}){0,3}"
                      r"\.(html|css|js|svg)\Z")
_MEDIA_TYPES = {
    "html": "text/html; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=(), usb=()",
    "cache-control": "no-cache",
}


def _read(name: str) -> bytes | None:
    """The bytes of ``static/<name>``, or None when there is no such file."""
    path = resources.files(__package__).joinpath("static", *name.split("/"))
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


async def _file(name: str) -> Response:
    match = _NAME_RE.fullmatch(name)
    body = await anyio.to_thread.run_sync(_read, name) if match else None
    if body is None or match is None:
        return PlainTextResponse("not found\n", status_code=404, headers=SECURITY_HEADERS)
    return Response(body, media_type=_MEDIA_TYPES[match.group(1)], headers=SECURITY_HEADERS)


async def page(request: Request) -> Response:
    return await _file("index.html")


async def static(request: Request) -> Response:
    return await _file(request.path_params["name"])


ROUTES = [
    Route(CONSOLE_PATH, page, methods=["GET"]),
    Route(f"{CONSOLE_PATH}/", page, methods=["GET"]),
    Route(f"{STATIC_PREFIX}{{name:path}}", static, methods=["GET"]),
]
