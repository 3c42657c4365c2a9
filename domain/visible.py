"""Text a person reads, shown as text: THE rule for characters a reader would not see as written.

Nodes and tenants set strings that end up on an operator's terminal, in log files and in the
console: hostnames, GPU names, bcd versions, messages, names, reasons. A terminal acts on
control characters (ESC starts a sequence that can retitle the window, clear the screen or
colour what follows; C1 controls such as U+009B do the same on some terminals), and
bidirectional controls (U+202A-U+202E, U+2066-U+2069, ...) reorder what a reader sees. So
every place a person reads such a string shows those characters escaped, by this one rule
(docs/security.md, "Text from nodes and tenants"):

* hidden: a character of the Unicode categories Cc (controls: C0, DEL, C1), Cf (format:
  bidi controls, zero-width characters, soft hyphen), Cs (lone surrogates), Zl and Zp (line
  and paragraph separators);
* shown as ``\\xHH`` (below U+0100), ``\\uHHHH`` or ``\\UHHHHHHHH``, as Python writes them.

``domain/text.py`` refuses these characters in the names and reasons callers set; the CLI's
tables, ``get`` views and event lines (cli/tables.py, cli/event_lines.py), the log formatter
(api/wire/logs.py) and the console (api/http/console/static/js/dom.js, ``visible``, the same
categories as a regular expression) escape them. Standard library only: bcd ships this module
(scripts/build-bcd).
"""

from __future__ import annotations

import unicodedata

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_hidden(char: str) -> bool:
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def hidden_character(text: str) -> str | None:
    """The first character of ``text`` a reader would not see as written (None: none)."""
    if text.isprintable():  # the fast path: no Cc, Cf, Cs, Zl, Zp (nor Zs, Co, Cn)
        return None
    return next((char for char in text if is_hidden(char)), None)


def escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str, keep: str = "") -> str:
    """``text`` with every hidden character escaped (those in ``keep``, such as a newline
    between the lines of a traceback, stay)."""
    if hidden_character(text) is None:
        return text
    return "".join(escape(c) if c not in keep and is_hidden(c) else c for c in text)


def visible_json(text: str) -> str:
    """A JSON document's text with every hidden character as a JSON escape (``\\u202e``):
    the same document for a program, safe on a terminal (JSON escapes C0 controls itself,
    not C1 nor bidi controls when it keeps non-ASCII text as it is)."""
    if hidden_character(text) is None:
        return text
    out = []
    for char in text:
        if not is_hidden(char):
            out.append(char)
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:  # a UTF-16 surrogate pair, as JSON writes characters past U+FFFF
            code = ord(char) - 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)
