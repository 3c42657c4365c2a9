"""``list --watch`` and ``get --watch`` (kubectl's ``-w``): the objects, then each change.

Built on the event log's stream (``GET …/events/watch``, or the local store's log without a
server): once the stream is open, the command lists (or gets) the objects and prints them;
then every event about one of them, or about a new one the list's filters keep, makes it read
that object again and print it: a row aligned under the table's header on a terminal (or
with ``-o table|wide``), one JSON line per object with ``-o json`` (the default when piped),
its id with ``-o name``. A row that leaves the filters (``--state active`` and it was
released) prints once more, in its new state. It reconnects and resumes like ``events
watch``; Ctrl-C ends it (exit 130).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.tables import Rows, Table
from better_compute.domain.errors import InvalidInput, NotFound

Doc = dict[str, Any]


def add_watch_flag(parser: Any, what: str) -> None:
    parser.add_argument("--watch", "-w", action="store_true",
                        help=f"after printing, print {what} again each time it changes "
                        "(Ctrl-C ends it)")


def follow(ctx: Context, *, types: str, first: Callable[[], list[Doc]],
           fetch: Callable[[str], Doc], keep: Callable[[Doc], bool], table: Table,
           only: set[str] | None = None) -> int:
    """Print ``first()``, then each object of an event of ``types`` again, re-read with
    ``fetch(id)``: those ``keep`` holds for, and those printed before. ``only``: the ids to
    follow (``get --watch``); None follows whatever the events name."""
    if getattr(ctx.args, "query", None):
        raise InvalidInput("--watch prints whole objects as they change: leave out --query "
                           "(or pipe -o json to jq)")
    out = sys.stdout
    fmt = ctx.output or ("table" if out.isatty() else "json")
    shown: set[str] = set()
    rows: list[Rows] = []

    def render(doc: Doc) -> str:
        if fmt in ("table", "wide"):
            return rows[0].line(doc)
        if fmt == "name":
            return f"{doc['id']}\n"
        if fmt == "yaml":
            import yaml

            return "---\n" + str(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        return json.dumps(doc, separators=(",", ":")) + "\n"

    def listed() -> None:
        if rows or shown:  # a reconnect resumes the stream: the list stands
            return
        docs = first()
        shown.update(str(d["id"]) for d in docs)
        if fmt in ("table", "wide"):
            rows.append(Rows(table, docs, wide=fmt == "wide"))
            out.write(rows[0].first)
        else:
            out.write("".join(render(d) for d in docs))
        out.flush()

    def changed(_: str, event: Doc) -> str | None:
        subject = str(event.get("subject") or "")
        if not subject or (only is not None and subject not in only):
            return None
        try:
            doc = fetch(subject)
        except NotFound:
            return None
        if subject not in shown and not keep(doc):
            return None
        shown.add(subject)
        return render(doc).rstrip("\n")

    return _stream(ctx, types, changed, listed)


def _stream(ctx: Context, types: str, show: Callable[[str, Doc], str | None],
            on_connect: Callable[[], None]) -> int:
    from better_compute.cli.commands.events import watch_http, watch_local
    from better_compute.cli.signals import interruptible

    try:
        with interruptible():
            if ctx.env.get("BETTER_COMPUTE_URL", "").strip():
                watch_http(ctx.env, None, types, sys.stdout, sys.stderr, show,
                           on_connect=on_connect)
            else:
                watch_local(ctx.env, None, types, sys.stdout, show, on_connect=on_connect)
    except BrokenPipeError:  # the reader went away (| head): a normal end
        return 0
    return 0
