"""Tables a person reads: curated columns per resource, plain aligned text, ids never cut.

Like kubectl's: an upper-case header, two spaces between columns, one line per object, the
columns that answer "what is it and how is it doing" (``-o wide`` adds the rest of the useful
scalars). A column marked ``varies`` shows only when the rows differ in it (the POOL of
reservations listed for one pool says nothing), and always with ``-o wide``. Times are ages
("5m") or offsets from now ("in 1h55m", "12m ago"), so a row fits a 120-column terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from better_compute.cli.event_lines import summary
from better_compute.domain.visible import visible

if TYPE_CHECKING:
    from datetime import datetime

Getter = Callable[[dict[str, Any]], Any]


class Column(NamedTuple):
    header: str
    get: Getter
    wide: bool = False  # only with -o wide
    varies: bool = False  # left out when every row has the same value (unless -o wide)


def _as_rows(value: Any) -> list[dict[str, Any]]:
    return value if isinstance(value, list) else [value]


class Table(NamedTuple):
    columns: tuple[Column, ...]
    rows: Callable[[Any], list[dict[str, Any]]] = _as_rows
    footer: Callable[[Any], str] | None = None


def with_tenant(table: Table) -> Table:
    """``table`` with TENANT first, shown by default (a list of every tenant's objects)."""
    rest = tuple(c for c in table.columns if c.header != "TENANT")
    tenant = Column("TENANT", lambda d: d.get("tenantId"))
    return table._replace(columns=(tenant, *rest))


def cell(value: Any) -> str:
    """A value as a table shows it: every character a terminal would act on, or a reader
    would not see as written, escaped (domain/visible.py)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.1f}"
    if isinstance(value, list):  # never JSON in a cell: a detail view nests (describe)
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{cell(k)}={cell(v)}" for k, v in value.items())
    return visible(str(value))


def _parse_time(text: Any) -> datetime | None:
    from datetime import UTC, datetime

    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def span(seconds: float) -> str:
    """kubectl's short durations: 45s, 12m, 1h55m, 3h, 2d4h, 12d."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h}h{m}m" if m and h < 10 else f"{h}h"
    d, h = divmod(s // 3600, 24)
    return f"{d}d{h}h" if h and d < 10 else f"{d}d"


def _now() -> datetime:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def age(text: Any, now: datetime | None = None) -> str:
    moment = _parse_time(text)
    if moment is None:
        return ""
    return span(((now or _now()) - moment).total_seconds())


def offset(text: Any, now: datetime | None = None) -> str:
    """A time as seen from now: "in 1h55m" or "12m ago"."""
    moment = _parse_time(text)
    if moment is None:
        return ""
    seconds = (moment - (now or _now())).total_seconds()
    return f"in {span(seconds)}" if seconds > 0 else f"{span(seconds)} ago"


def _text_rows(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    out = []
    for row in [headers, *rows]:
        out.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "".join(line + "\n" for line in out)


def render(value: Any, table: Table, *, wide: bool = False) -> str:
    rows = table.rows(value)
    if not rows:
        return "No resources found.\n"
    columns = [c for c in table.columns if wide or not c.wide]
    cells = [[cell(c.get(r)) for c in columns] for r in rows]
    keep = [i for i, c in enumerate(columns)
            if wide or not c.varies or len({row[i] for row in cells}) > 1]
    text = _text_rows([columns[i].header for i in keep], [[row[i] for i in keep] for row in cells])
    if table.footer is not None:
        text += table.footer(value)
    return text


class Rows:
    """A table printed a row at a time (``list --watch``): the header and the first rows set
    the columns and their widths; every later row is aligned to them (a longer cell only
    pushes its own line)."""

    def __init__(self, table: Table, docs: list[dict[str, Any]], *, wide: bool) -> None:
        self.columns = [c for c in table.columns if wide or not c.wide]
        cells = [self._cells(d) for d in docs]
        self.widths = [max([len(c.header), *(len(row[i]) for row in cells)])
                       for i, c in enumerate(self.columns)]
        self.first = "".join(self._line(row) for row in
                             [[c.header for c in self.columns], *cells])

    def _cells(self, doc: dict[str, Any]) -> list[str]:
        return [cell(c.get(doc)) for c in self.columns]

    def _line(self, row: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(row, self.widths, strict=True)).rstrip() + "\n"

    def line(self, doc: dict[str, Any]) -> str:
        return self._line(self._cells(doc))


def generic_table(value: Any) -> str:
    """Any other answer: a list of objects by its scalar fields, an object as its fields,
    nested (``describe``)."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        headers: list[str] = []
        for row in value:
            headers.extend(k for k, v in row.items()
                           if k not in headers and not isinstance(v, dict | list))
        return _text_rows([cell(h).upper() for h in headers],
                          [[cell(row.get(h)) for h in headers] for row in value])
    if isinstance(value, list):
        return "".join(cell(v) + "\n" for v in value) if value else "No resources found.\n"
    if isinstance(value, dict):
        return describe(value)
    return cell(value) + "\n"


# --------------------------------------------------------------------------- detail views

INDENT = "  "
INLINE_LIST = 72  # a list of scalars up to this many characters stays on its key's line
NONE = "<none>"  # an empty or null value, as kubectl describe shows it


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _flat(items: list[Any]) -> bool:
    """Objects whose values are scalars or short lists of scalars: a table reads them."""
    return all(isinstance(i, dict) and all(_scalar(v) or (isinstance(v, list) and all(
        _scalar(x) for x in v)) for v in i.values()) for i in items)


def _inline(value: Any) -> str:
    """A scalar, or a list of scalars joined by commas, as one cell."""
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value) if value else NONE
    return NONE if value is None else cell(value)


def describe(doc: dict[str, Any], depth: int = 0) -> str:
    """One object as kubectl describe shows one: a field a line, ``name:`` and its value
    aligned; nested objects indented under their name; lists of scalars on their line (or one
    ``- item`` a line when long); lists of flat objects as an indented table; never JSON."""
    pad = INDENT * depth
    width = max((len(cell(k)) for k in doc), default=0) + 2
    lines: list[str] = []
    for key, value in doc.items():
        label = f"{pad}{cell(key)}:"
        if _scalar(value) or (isinstance(value, list | dict) and not value):
            shown = _inline(None if isinstance(value, list | dict) else value)
            lines.append(f"{label.ljust(len(pad) + width)}{shown}".rstrip())
        elif isinstance(value, dict):
            lines.append(label)
            lines.append(describe(value, depth + 1).rstrip("\n"))
        elif all(_scalar(v) for v in value):
            text = _inline(value)
            if len(text) <= INLINE_LIST:
                lines.append(f"{label.ljust(len(pad) + width)}{text}")
            else:
                lines.append(label)
                lines.extend(f"{pad}{INDENT}- {cell(v)}" for v in value)
        elif _flat(value):
            lines.append(label)
            headers: list[str] = []
            for row in value:
                headers.extend(k for k in row if k not in headers)
            table = _text_rows([cell(h).upper() for h in headers],
                               [[_inline(row.get(h)) if h in row else "" for h in headers]
                                for row in value])
            lines.extend(f"{pad}{INDENT}{line}" for line in table.splitlines())
        else:
            lines.append(label)
            for item in value:
                if isinstance(item, dict):
                    body = describe(item, depth + 2).splitlines()
                    first = body[0][len(pad) + 2 * len(INDENT):] if body else NONE
                    lines.append(f"{pad}{INDENT}- {first}")
                    lines.extend(body[1:])
                else:
                    lines.append(f"{pad}{INDENT}- {_inline(item)}")
    return "".join(line + "\n" for line in lines)


# --------------------------------------------------------------------------- the resources


def _get(*path: str) -> Getter:
    def get(doc: dict[str, Any]) -> Any:
        value: Any = doc
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return get


def _name(doc: dict[str, Any]) -> Any:
    """A site's or pool's name: its --name, else its --key (the rule api/services/names.py
    resolves names by, so what NAME shows is what `get NAME` takes)."""
    return doc.get("name") or doc.get("key")


def _node_state(doc: dict[str, Any]) -> str:
    parts = [str(doc.get("provisionState") or "")]
    if _get("acceptance", "state")(doc) == "failed":
        parts.append("failed")
    if _get("maintenance", "cordoned")(doc):
        parts.append("cordoned")
    return ",".join(p for p in parts if p)


def _node_gpus(doc: dict[str, Any]) -> str:
    gpus = doc.get("gpus") or []
    return f"{sum(1 for g in gpus if g.get('healthy', True))}/{len(gpus)}"


NODES = Table((
    Column("ID", _get("id")),
    Column("POOL", _get("poolId")),
    Column("STATE", _node_state),
    Column("GPUS", _node_gpus),
    Column("HELD", lambda d: d.get("heldGpus", 0)),
    Column("SESSION", _get("session", "state")),
    Column("AGE", lambda d: age(d.get("joinedAt"))),
    Column("HOSTNAME", _get("hardware", "hostname"), wide=True),
    Column("TENANT", _get("tenantId"), wide=True),
    Column("SITE", _get("siteId"), wide=True),
    Column("EPOCH", _get("session", "epoch"), wide=True),
    Column("LAST SEEN", lambda d: age(_get("session", "lastSeen")(d)), wide=True),
    Column("BCD", _get("bcdVersion"), wide=True),
))

RESERVATIONS = Table((
    Column("ID", _get("id")),
    Column("POOL", _get("poolId"), varies=True),
    Column("GPUS", _get("gpuCount")),
    Column("STATE", _get("state")),
    Column("NODE", _get("nodeId")),
    Column("START", lambda d: offset(d.get("start"))),
    Column("END", lambda d: offset(d.get("endedAt") or d.get("end"))),
    Column("TENANT", _get("tenantId"), wide=True),
    Column("ALLOCATION", _get("allocationId"), wide=True),
    Column("KEY", _get("key"), wide=True),
))

_CAPACITY_FIELDS = ("total", "allocatable", "allocated", "reserved", "available",
                    "provisioning", "unhealthy", "maintenance", "unreachable")


def _capacity_rows(value: Any) -> list[dict[str, Any]]:
    resources = value.get("resources", {}) if isinstance(value, dict) else {}
    rows = []
    for name, numbers in resources.items():
        unit = numbers.get("unit")
        rows.append({"resource": f"{name} ({unit})" if unit else name, **numbers})
    return rows


def _capacity_footer(value: Any) -> str:
    nodes = value.get("nodes") if isinstance(value, dict) else None
    if not isinstance(nodes, dict):
        return ""
    return "nodes: " + ", ".join(f"{v} {k}" for k, v in nodes.items()) + "\n"


CAPACITY = Table(
    (Column("RESOURCE", _get("resource")),
     *(Column(f.upper(), _get(f)) for f in _CAPACITY_FIELDS)),
    rows=_capacity_rows, footer=_capacity_footer)

SITES = Table((
    Column("ID", _get("id")), Column("KIND", _get("kind")), Column("REGION", _get("region")),
    Column("NAME", _name), Column("AGE", lambda d: age(d.get("createdAt"))),
    Column("TENANT", _get("tenantId"), wide=True), Column("KEY", _get("key"), wide=True),
))

POOLS = Table((
    Column("ID", _get("id")), Column("SITE", _get("siteId")), Column("CLASS", _get("class")),
    Column("MODEL", _get("gpuModel")), Column("NAME", _name),
    Column("OFFERED TO", lambda d: ",".join(o["tenantId"] for o in d.get("offerings") or [])),
    Column("AGE", lambda d: age(d.get("createdAt"))),
    Column("TENANT", _get("tenantId"), wide=True), Column("KEY", _get("key"), wide=True),
))

JOIN_TOKENS = Table((
    Column("ID", _get("id")), Column("POOL", _get("poolId")), Column("STATE", _get("state")),
    Column("USES", lambda d: f"{d.get('uses', 0)}/{d.get('maxUses', '')}"),
    Column("EXPIRES", lambda d: offset(d.get("expiresAt"))),
    Column("EXPECT", lambda d: ",".join(f"{k}={v}" for k, v in (d.get("expect") or {}).items()),
           wide=True),
    Column("KEY", _get("key"), wide=True),
))

TOKENS = Table((
    Column("ID", _get("id")), Column("TENANT", _get("tenantId")), Column("ROLE", _get("role")),
    Column("NAME", _get("name")), Column("AGE", lambda d: age(d.get("createdAt"))),
    Column("REVOKED", lambda d: age(d.get("revokedAt")) and age(d.get("revokedAt")) + " ago"),
))

EVENTS = Table((
    Column("SEQUENCE", _get("sequence")),
    Column("TIME", _get("time")),
    Column("TYPE", _get("type")),
    Column("SUMMARY", lambda d: summary(d)),
    Column("SUBJECT", _get("subject"), wide=True),
))
