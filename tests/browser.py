"""The console in a real browser: Debian's Chromium, headless, driven by Playwright.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium``
(``scripts/test`` installs Debian's package when it is missing) with the
flags that work on a machine with no outside network. Without Chromium the
tests FAIL with the fix; they never skip.

``ConsolePage`` is one browser tab on the console at one width, with what a
test needs: sign in, open a view, read the fields the page shows, take a
screenshot, run axe-core. It records every page error, every alert dialog
and every URL the page requested, so tests can assert that nothing ran that
should not have, and that no token ever went into a URL.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("BC_TEST_CHROMIUM", "/usr/bin/chromium"))
# What works on a machine whose network is closed (docs/internals/console.md#browser-tests).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
SHOTS = ROOT / "build" / "console-screenshots"
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
WIDE, NARROW = 1280, 390


def require_chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"the console's browser tests need Chromium at {CHROMIUM}, and it is missing: "
                    "run scripts/test, which installs Debian's package when it can (as root: "
                    "apt-get install -y chromium), or install it yourself; BC_TEST_CHROMIUM "
                    "names another binary")
    return CHROMIUM


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """One headless Chromium (a fresh profile in a temporary folder), closed at the end."""
    binary = require_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the console's browser tests need Playwright: run scripts/bootstrap "
                    "(pip install -e '.[dev]' installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(binary), args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class ConsolePage:
    """One tab on ``{server_url}/console``, in its own browser context (its own session)."""

    def __init__(self, browser: Any, server_url: str, width: int = WIDE) -> None:
        self.url = f"{server_url}/console"
        self.width = width
        # The test server's certificate comes from the store's own serving CA.
        self.context = browser.new_context(ignore_https_errors=True,
                                           viewport={"width": width, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requested: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("dialog", self._dialog)
        self.page.on("request", lambda request: self.requested.append(request.url))

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def close(self) -> None:
        self.context.close()

    # ------------------------------------------------------------------ actions

    def open(self) -> None:
        self.page.goto(self.url)
        self.page.locator("#token").wait_for()

    def sign_in(self, token: str) -> None:
        self.open()
        self.page.fill("#token", token)
        self.page.click("#sign-in-form button[type=submit]")
        self.page.locator("#who").wait_for()
        self.page.locator("#live[data-state=live]").wait_for()

    def view(self, name: str) -> None:
        self.page.click(f"#nav a[data-view={name}]")
        self.page.locator(f"#view-{name}").wait_for()

    def shot(self, name: str, full_page: bool = True) -> Path:
        """A screenshot into build/console-screenshots/NAME-WIDTH.png."""
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}-{self.width}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    # ------------------------------------------------------------------ reading

    def fields(self, selector: str) -> dict[str, str]:
        """``data-field`` name -> text of every such element under ``selector``."""
        pairs = self.page.eval_on_selector_all(
            f"{selector} [data-field]",
            "els => els.map(e => [e.dataset.field, e.textContent.trim()])")
        return dict(pairs)

    def feed_sequences(self) -> list[int]:
        """The sequences in the feed, oldest first."""
        shown = self.page.eval_on_selector_all("#feed li", "els => els.map(e => e.dataset.sequence)")
        return [int(s) for s in reversed(shown)]

    def text(self) -> str:
        """Everything the page holds: its markup, attributes included."""
        return str(self.page.content())

    def axe_violations(self, impacts: tuple[str, ...] = ("serious", "critical")
                       ) -> list[dict[str, Any]]:
        """axe-core's violations of at least ``impacts`` (tests/vendor/axe-core, MPL-2.0).

        Evaluated through the DevTools protocol, which the page's CSP does not govern, so the
        page's policy stays exactly what users get.
        """
        if not self.page.evaluate("typeof window.axe !== 'undefined'"):  # once per document
            self.page.evaluate(AXE.read_text() + "\n;0")
        result = self.page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
            ".map(v => ({id: v.id, impact: v.impact, help: v.help,"
            " nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}))")
        return [v for v in result if v["impact"] in impacts]
