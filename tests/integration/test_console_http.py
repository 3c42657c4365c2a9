"""The console's files over HTTP (the ASGI app in this process), and what its scripts may do.

The browser tests (tests/e2e/test_console_*.py) show the page working; these pin what makes
it safe whatever the data: the headers on every file, the names that can be read, and that
no script parses data as markup, logs, or keeps the token anywhere but sessionStorage.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from better_compute.api.http import console
from better_compute.api.http.app import build_app

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "api" / "http" / "console" / "static"
SCRIPTS = sorted((STATIC / "js").glob("*.js"))


def get(app: Any, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://compute.test") as c:
            return await c.get(path)

    return anyio.run(go)


def console_app() -> Starlette:
    return Starlette(routes=console.ROUTES)


def assert_safe_headers(response: httpx.Response) -> None:
    h = response.headers
    policy = dict(part.strip().split(" ", 1) for part in h["content-security-policy"].split(";"))
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'" and policy["form-action"] == "'none'"
    assert "unsafe" not in h["content-security-policy"]
    assert h["x-frame-options"] == "DENY"
    assert h["x-content-type-options"] == "nosniff"
    assert h["referrer-policy"] == "no-referrer"
    assert "set-cookie" not in h


def test_serve_mounts_the_console_on_the_api_listener(runtime: Any) -> None:
    response = get(build_app(runtime), "/console")
    assert response.status_code == 200
    assert_safe_headers(response)


def test_the_page_has_no_inline_script_or_style() -> None:
    for path in ("/console", "/console/"):
        response = get(console_app(), path)
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/html; charset=utf-8"
        assert_safe_headers(response)
        html = response.text
        assert re.findall(r"<script\b(?![^>]*\bsrc=)", html) == []  # every script has a src
        assert "<style" not in html and " style=" not in html
        assert re.search(r"\son[a-z]+=", html) is None  # no inline event handlers


def referenced_files() -> set[str]:
    """Every file the page loads: the page's src/href and every module's imports."""
    names = set(re.findall(r'(?:src|href)="/console/static/([^"]+)"',
                           (STATIC / "index.html").read_text()))
    for script in SCRIPTS:
        names |= {f"js/{m}" for m in re.findall(r"from '\./([a-z0-9_-]+\.js)'", script.read_text())}
    return names


def test_every_file_the_page_loads_is_served_with_the_same_headers() -> None:
    names = referenced_files()
    assert {"console.css", "js/main.js", "js/api.js", "js/dom.js"} <= names
    expected = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".svg": "image/svg+xml"}
    for name in names:
        response = get(console_app(), f"/console/static/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"] == expected[Path(name).suffix], name
        assert response.content == (STATIC / name).read_bytes()
        assert_safe_headers(response)


@pytest.mark.parametrize("path", [
    "/console/static/%2e%2e/__init__.py",
    "/console/static/js/%2e%2e/%2e%2e/__init__.py",
    "/console/static/__init__.py",
    "/console/static/JS/MAIN.JS",
    "/console/static/js/missing.js",
    "/console/static/js",
    "/console/static/.hidden.js",
    "/console/static//etc/passwd",
    "/console/static/js/main.js.map",
])
def test_names_outside_the_console_files_are_not_found(path: str) -> None:
    response = get(console_app(), path)
    assert response.status_code == 404
    assert response.text == "not found\n"
    assert_safe_headers(response)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_parses_data_as_markup_logs_or_stores_the_token_elsewhere(script: Path
                                                                            ) -> None:
    code = script.read_text()
    forbidden = ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "localStorage", "document.cookie", "console.", "setAttribute('style'",
                 "DOMParser", "createContextualFragment", "srcdoc"]
    assert [f for f in forbidden if f in code] == []
    assert "sessionStorage" not in code or script.name == "main.js"


def test_the_package_ships_every_console_file() -> None:
    """pyproject's package-data covers every file under static/ (an installed wheel has them)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["better_compute.api.http.console"]
    files = [PurePosixPath(p.relative_to(STATIC.parent).as_posix())
             for p in STATIC.rglob("*") if p.is_file()]
    assert files

    def shipped(f: PurePosixPath) -> bool:  # setuptools' globs: `*` stays within one folder
        return any(len(f.parts) == len(PurePosixPath(g).parts) and f.match(g) for g in globs)

    assert [str(f) for f in files if not shipped(f)] == []
