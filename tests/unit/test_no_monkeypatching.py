"""No product module patches another module's, class's or object's behaviour (STYLE.md:
public extension points instead of patching). Checked on the source's AST:

- no ``setattr`` or ``delattr``, no ``del x.attr``;
- no assignment to an attribute of an imported name (a module, or a class of another module);
- no function (a ``def`` of the module, a lambda, a ``functools.partial``) assigned to an
  attribute of anything but ``self`` or ``cls``: a method replaced on an instance;
- no assignment three attributes deep (``a.b.c = …``: a part of another object's part, such
  as a library datastore's pool);
- no ``type: ignore[method-assign]``.

A library's behaviour is changed by its settings, factory arguments, or a subclass overriding
its public methods. The allow-list is empty and stays so.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "api", "cli", "domain", "projections")
ALLOWED: set[str] = set()  # "path:line" of an accepted patch: none
_METHOD_ASSIGN = re.compile(r"type:\s*ignore\[[^\]]*method-assign")


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _depth(target: ast.expr) -> int:
    depth = 0
    while isinstance(target, ast.Attribute):
        target, depth = target.value, depth + 1
    return depth


def _is_function(value: ast.expr, functions: set[str]) -> bool:
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name):
        return value.id in functions
    if isinstance(value, ast.Call):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else (
            value.func.id if isinstance(value.func, ast.Name) else "")
        return name in ("partial", "MethodType", "partialmethod")
    return False


def _targets(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for target in node.targets:
            found.extend(target.elts if isinstance(target, ast.Tuple | ast.List) else [target])
        return found
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def patches(source: str, name: str = "<source>") -> list[str]:
    """``line: what`` of each patch in ``source``."""
    tree = ast.parse(source, name)
    imported = {(alias.asname or alias.name).split(".")[0]
                for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in node.names}
    methods = {id(child) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
               for child in node.body}
    functions = {node.name for node in ast.walk(tree)  # a module's or a nested one, no method
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 and id(node) not in methods}
    found = [f"{number}: type: ignore[method-assign]"
             for number, line in enumerate(source.splitlines(), 1) if _METHOD_ASSIGN.search(line)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr"):
            found.append(f"{node.lineno}: {node.func.id}(...)")
        elif isinstance(node, ast.Delete):
            found.extend(f"{node.lineno}: del {ast.unparse(t)}" for t in node.targets
                         if isinstance(t, ast.Attribute))
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            value = node.value
            for target in _targets(node):
                if not isinstance(target, ast.Attribute):
                    continue
                root = _root(target)
                owner = root.id if isinstance(root, ast.Name) else ""
                if owner in imported:
                    found.append(f"{node.lineno}: {ast.unparse(target)} = … "
                                 f"(an attribute of the imported {owner})")
                elif _depth(target) >= 3:
                    found.append(f"{node.lineno}: {ast.unparse(target)} = … "
                                 "(a part of another object's part)")
                elif value is not None and _is_function(value, functions) and not (
                        owner in ("self", "cls") and isinstance(target.value, ast.Name)):
                    found.append(f"{node.lineno}: {ast.unparse(target)} = "
                                 f"{ast.unparse(value)} (a function put in place of a method)")
    return found


def test_no_product_module_patches_another_s_attributes() -> None:
    found = [f"{path.relative_to(ROOT)}:{entry}"
             for folder in PRODUCT for path in sorted((ROOT / folder).rglob("*.py"))
             if "__pycache__" not in path.parts
             for entry in patches(path.read_text(), str(path))]
    assert [f for f in found if f.split(": ")[0] not in ALLOWED] == [], (
        "monkeypatching (STYLE.md): use the library's setting, factory argument, or a "
        "subclass overriding a public method instead")


def test_the_check_finds_each_kind_of_patch() -> None:
    """What the rule must see (each of these was once in the product)."""
    source = '''
import asyncio
import functools
from eventsourcing import postgres

def open_store(datastore, loop):
    original = datastore.get_connection

    def get_connection(*args, **kwargs):
        return original(*args, **kwargs)

    datastore.get_connection = get_connection
    loop.create_server = functools.partial(loop.create_server, backlog=1)
    self.datastore.transaction = lambda commit=False: None
    postgres.ConnectionPool = object
    asyncio.get_event_loop().create_server = None
    setattr(datastore, "close", None)
    del loop.create_server
    loop.create_server = datastore  # type: ignore[method-assign]

def tune(store: ComputeStore) -> None:
    store.guard = None
    store.datastore.pool.kwargs = {}
    store.cache.size = 1

class Mine:
    def __init__(self, conn):
        self.conn = conn
        self.read = self.conn.read
        self.count, self.total = 0, 0
'''
    lines = [int(entry.split(":")[0]) for entry in patches(source)]
    assert sorted(lines) == [12, 13, 14, 15, 16, 17, 18, 19, 23], patches(source)
