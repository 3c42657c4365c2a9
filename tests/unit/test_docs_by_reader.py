"""docs/ by reader: docs/README.md lists every page, and the tenants' and operators' pages
cite no source file and no test.

docs/README.md groups the pages by reader; the pages it links under its "Developers" heading
are the internals, where source paths belong. Every other page is for people who use or run
the control plane: it describes behaviour, commands and settings, and names no `.py` file and
nothing under tests/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
INDEX = DOCS / "README.md"
DEVELOPERS_HEADING = re.compile(r"^## Developers\b")
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
SOURCE = re.compile(r"[\w/.-]*\w\.py\b|\btests/[\w/.-]*")


def indexed() -> tuple[set[Path], set[Path]]:
    """The pages docs/README.md links: (user pages, developer pages)."""
    users: set[Path] = set()
    developers: set[Path] = set()
    into = users
    for line in INDEX.read_text().splitlines():
        if line.startswith("## "):
            into = developers if DEVELOPERS_HEADING.match(line) else users
        for target in LINK.findall(line):
            into.add((DOCS / target).resolve())
    return users, developers


USERS, DEVELOPERS = indexed()


def test_the_index_lists_every_page_and_only_pages_that_exist() -> None:
    pages = {p.resolve() for p in DOCS.rglob("*.md") if p != INDEX}
    listed = USERS | DEVELOPERS
    missing = sorted(str(p.relative_to(DOCS)) for p in pages - listed)
    dangling = sorted(str(p) for p in listed - pages)
    assert not missing, f"pages under docs/ that docs/README.md does not list: {missing}"
    assert not dangling, f"docs/README.md links pages that do not exist: {dangling}"
    assert not USERS & DEVELOPERS, "a page is listed both for users and for developers"


def test_the_index_has_readers_on_both_sides() -> None:
    """The split exists: the parse above found user pages and developer pages."""
    assert DOCS / "tutorial.md" in USERS
    assert DOCS / "architecture.md" in DEVELOPERS


@pytest.mark.parametrize("page", sorted(str(p.relative_to(DOCS)) for p in USERS))
def test_user_pages_cite_no_source_or_test(page: str) -> None:
    text = (DOCS / page).read_text()
    cited = [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
             for m in SOURCE.finditer(line)]
    assert not cited, (
        f"docs/{page} is for tenants or operators but cites source or tests "
        f"(line, citation): {cited}; say what it does, or move the detail to a developers' page")
