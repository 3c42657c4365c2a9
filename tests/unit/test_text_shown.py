"""The one rule for text a person reads (domain/visible.py), and every place that applies it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import yaml

from better_compute.api.wire.logs import line
from better_compute.cli.event_lines import line as event_line
from better_compute.cli.output import emit
from better_compute.cli.tables import NODES, render
from better_compute.domain.visible import HIDDEN_CATEGORIES, visible, visible_json

HOSTILE = "\x1b]0;TITLE\x07\x1b[2J\x1b[31m\u202e[red]x[/red]\u2066\x9b\u200b\U000e0001"
RAW = ("\x1b", "\x07", "\u202e", "\u2066", "\x9b", "\u200b", "\U000e0001")
DOM_JS = (Path(__file__).resolve().parents[2] / "api" / "http" / "console" / "static" / "js"
          / "dom.js")


def _clean(text: str) -> bool:
    return not any(raw in text for raw in RAW)


def test_hidden_characters_are_escaped_as_python_and_yaml_write_them() -> None:
    assert visible("plain Zürich, 東京, emoji 😀") == "plain Zürich, 東京, emoji 😀"
    assert visible(HOSTILE) == ("\\x1b]0;TITLE\\x07\\x1b[2J\\x1b[31m\\u202e[red]x[/red]\\u2066"
                                "\\x9b\\u200b\\U000e0001")
    assert visible("a\nb\tc", keep="\n") == "a\nb\\x09c"
    assert visible("\ud800") == "\\ud800"  # a lone surrogate
    assert visible(visible(HOSTILE)) == visible(HOSTILE)  # escaping twice changes nothing


def test_json_text_keeps_its_value_and_shows_no_hidden_character() -> None:
    doc = {"v": HOSTILE, "n": "Zürich"}
    text = visible_json(json.dumps(doc, ensure_ascii=False))
    assert _clean(text) and "Zürich" in text and json.loads(text) == doc


def test_tables_get_views_yaml_and_event_lines_show_no_raw_control_or_bidi_character() -> None:
    node = {"id": "node_x", "bcdVersion": HOSTILE, "hardware": {"hostname": HOSTILE},
            "gpus": [{"uuid": "GPU-1", "name": HOSTILE}], "provisionState": HOSTILE}
    for fmt in ("table", "wide", "yaml"):
        out = io.StringIO()
        emit(node, output=fmt, out=out)
        assert _clean(out.getvalue()), (fmt, out.getvalue())
        assert "[red]x[/red]" in out.getvalue()  # markup is text, never interpreted
    out = io.StringIO()
    emit(node, output="yaml", out=out)
    assert yaml.safe_load(out.getvalue()) == node  # the escapes read back as the value
    assert _clean(render([node], NODES, wide=True))
    event = {"sequence": 1, "type": "node.connected", "time": "2030-01-01T00:00:00Z",
             "subject": "node_x" + HOSTILE, "data": {"epoch": 1, "reason": HOSTILE}}
    assert _clean(event_line(event, colour=False))
    assert _clean(event_line({**event, "type": "node.disconnected"}, colour=True)
                  .replace("\x1b[33m", "").replace("\x1b[0m", ""))


def test_a_bare_value_is_escaped_on_a_terminal_and_kept_for_a_program() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown, piped = Terminal(), io.StringIO()
    emit({"bcdVersion": HOSTILE}, query="bcdVersion", out=shown)
    emit({"bcdVersion": HOSTILE}, query="bcdVersion", out=piped)
    assert _clean(shown.getvalue()) and piped.getvalue() == HOSTILE + "\n"


def test_log_lines_text_and_json_show_no_raw_character_and_stay_one_line() -> None:
    text = line("text", 0, "warning", "x", "node said " + HOSTILE + "\nFAKE LINE",
                {"v": HOSTILE})
    assert _clean(text) and "\n" not in text
    doc = line("json", 0, "warning", "x", "node said " + HOSTILE, {"v": HOSTILE})
    assert _clean(doc) and json.loads(doc)["v"] == HOSTILE


def test_the_consoles_rule_names_the_same_categories() -> None:
    """dom.js's ``HIDDEN`` is the regular expression of the same Unicode categories (a
    browser test, tests/e2e/test_console_browser.py, runs it on every character to U+3000)."""
    source = DOM_JS.read_text()
    pattern = re.search(r"const HIDDEN = /\[([^\]]*)\]/gu;", source)
    assert pattern is not None, "dom.js lost its HIDDEN rule"
    assert set(re.findall(r"\\p\{(\w+)\}", pattern.group(1))) == HIDDEN_CATEGORIES
