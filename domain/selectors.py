"""GPU selectors: a small expression language over a GPU's attributes.

``better-compute reserve --selector "vramGiB >= 80 and model == 'H100'"`` keeps
only the GPUs the expression is true for. The grammar::

    expr       := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | primary
    primary    := "(" expr ")" | comparison
    comparison := ATTRIBUTE OP literal | ATTRIBUTE "in" "[" literal ("," literal)* "]"
    OP         := "==" | "!=" | "<" | "<=" | ">" | ">="
    literal    := NUMBER | 'string' | "string" | true | false

Attributes (``ATTRIBUTES``): ``vramGiB`` (number, the card's memory in GiB),
``model`` (the family, H100), ``product`` (the board's product name),
``name`` (the name the driver reports), ``nvlinkDomain`` (string, or null when
the GPU has no NVLink peers), ``index`` (number), ``healthy`` (true/false).
Strings compare case-sensitively with ``==``/``!=``, but a ``model`` literal is
first read by the table of GPU models (``'h100'`` is ``H100``); ``<`` and friends take
numbers only. A comparison with an attribute the GPU does not report is false.
Parse errors name the position and say how to fix the expression.

Bounds (docs/security.md): at most ``MAX_LENGTH`` characters, parentheses and
``not`` nested at most ``MAX_DEPTH`` deep, number literals of at most
``MAX_NUMBER_CHARS`` characters. Tokenizing is one left-to-right pass over
the text (each match starts where the last ended; nothing copies the rest of
the text), so parsing takes time linear in the length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from better_compute.domain.errors import InvalidInput
from better_compute.domain.gpu_models import known_model

ATTRIBUTES: dict[str, str] = {
    "vramGiB": "number",
    "model": "string",
    "product": "string",
    "name": "string",
    "nvlinkDomain": "string",
    "index": "number",
    "healthy": "bool",
}
_OPS = ("==", "!=", "<=", ">=", "<", ">")
# One match per token, each starting where the last one ended: ``end`` at the end of the
# text, ``bad`` for any character that starts no token.
_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<number>\d+(?:\.\d+)?)
      | (?P<string>'[^']*'|"[^"]*")
      | (?P<op>==|!=|<=|>=|<|>)
      | (?P<punct>[()\[\],])
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<end>\Z)
      | (?P<bad>.)
    )""",
    re.VERBOSE | re.DOTALL,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false"}
MAX_LENGTH = 1024
MAX_DEPTH = 32
MAX_NUMBER_CHARS = 20

Predicate = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number | string | op | punct | word | end
    text: str
    pos: int
    value: Any = None


@dataclass(frozen=True)
class Selector:
    """A parsed selector: ``matches(attributes)`` tells whether a GPU is selected."""

    text: str
    _predicate: Predicate

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        return self._predicate(attributes)


def _error(text: str, pos: int, problem: str, hint: str) -> InvalidInput:
    return InvalidInput(
        f"--selector {text!r}: {problem} at position {pos + 1}; {hint}",
        data={"position": pos + 1},
    )


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    match = _TOKEN_RE.match
    while True:
        found = match(text, pos)
        assert found is not None  # ``bad`` matches any character, ``end`` the end
        kind = found.lastgroup or ""
        start = found.start(kind)
        if kind == "end":
            break
        raw = found.group(kind)
        if kind == "bad":
            if raw in "'\"":
                raise _error(text, start, "a string is not closed", f"end it with {raw}")
            raise _error(
                text, start, f"unexpected character {raw!r}",
                "use attributes, comparisons (== != < <= > >=), and/or/not, parentheses, "
                "numbers and quoted strings",
            )
        value: Any = None
        if kind == "number":
            if len(raw) > MAX_NUMBER_CHARS:
                raise _error(text, start, f"a number of {len(raw)} characters",
                             f"write numbers of at most {MAX_NUMBER_CHARS} characters")
            value = float(raw) if "." in raw else int(raw)
        elif kind == "string":
            value = raw[1:-1]
        elif kind == "word" and raw in ("true", "false"):
            value = raw == "true"
        tokens.append(_Token(kind, raw, start, value))
        pos = found.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

    def nest(self, tok: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _error(self.text, tok.pos, f"parentheses and not nest more than {MAX_DEPTH} "
                         "levels deep", "write the condition with fewer levels (and / or "
                         "chains need no parentheses)")

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def is_word(self, word: str) -> bool:
        return self.tok.kind == "word" and self.tok.text == word

    def parse(self) -> Predicate:
        if self.tok.kind == "end":
            raise _error(self.text, 0, "the selector is empty", 'write a condition such as "vramGiB >= 80"')
        pred = self.parse_or()
        if self.tok.kind != "end":
            raise _error(self.text, self.tok.pos, f"unexpected {self.tok.text!r}",
                         "join conditions with and / or")
        return pred

    def parse_or(self) -> Predicate:
        parts = [self.parse_and()]
        while self.is_word("or"):
            self.take()
            parts.append(self.parse_and())
        if len(parts) == 1:
            return parts[0]
        return lambda attrs: any(p(attrs) for p in parts)

    def parse_and(self) -> Predicate:
        parts = [self.parse_not()]
        while self.is_word("and"):
            self.take()
            parts.append(self.parse_not())
        if len(parts) == 1:
            return parts[0]
        return lambda attrs: all(p(attrs) for p in parts)

    def parse_not(self) -> Predicate:
        if self.is_word("not"):
            self.nest(self.take())
            inner = self.parse_not()
            self.depth -= 1
            return lambda attrs: not inner(attrs)
        return self.parse_primary()

    def parse_primary(self) -> Predicate:
        tok = self.tok
        if tok.kind == "punct" and tok.text == "(":
            self.nest(self.take())
            inner = self.parse_or()
            if not (self.tok.kind == "punct" and self.tok.text == ")"):
                raise _error(self.text, self.tok.pos, "missing ')'",
                             "close every '(' with a ')'")
            self.take()
            self.depth -= 1
            return inner
        return self.parse_comparison()

    def parse_comparison(self) -> Predicate:
        tok = self.take()
        if tok.kind != "word" or tok.text in _KEYWORDS:
            what = "the end of the selector" if tok.kind == "end" else repr(tok.text)
            raise _error(self.text, tok.pos, f"expected an attribute, found {what}",
                         f"start each condition with an attribute: {', '.join(ATTRIBUTES)}")
        if tok.text not in ATTRIBUTES:
            raise _error(self.text, tok.pos, f"unknown attribute {tok.text!r}",
                         f"attributes are {', '.join(ATTRIBUTES)}; quote strings, as in "
                         "model == 'H100'")
        attribute = tok.text
        if self.is_word("in"):
            self.take()
            return self.parse_in(attribute)
        op = self.take()
        if op.kind != "op":
            raise _error(self.text, op.pos, f"expected a comparison after {attribute}",
                         "use one of == != < <= > >= or in [...]")
        value = self.parse_literal()
        return _compare(self.text, op, attribute, value)

    def parse_in(self, attribute: str) -> Predicate:
        if not (self.tok.kind == "punct" and self.tok.text == "["):
            raise _error(self.text, self.tok.pos, "expected '[' after in",
                         "list the values as in ['H100', 'H200']")
        self.take()
        values = [self.parse_literal()]
        while self.tok.kind == "punct" and self.tok.text == ",":
            self.take()
            values.append(self.parse_literal())
        if not (self.tok.kind == "punct" and self.tok.text == "]"):
            raise _error(self.text, self.tok.pos, "expected ']'", "close the list with ]")
        self.take()
        allowed = tuple(_literal(attribute, v) for v in values)
        return lambda attrs: attrs.get(attribute) is not None and attrs.get(attribute) in allowed

    def parse_literal(self) -> Any:
        tok = self.take()
        if tok.kind in ("number", "string") or (tok.kind == "word" and tok.text in ("true", "false")):
            return tok.value
        what = "the end of the selector" if tok.kind == "end" else repr(tok.text)
        raise _error(self.text, tok.pos, f"expected a value, found {what}",
                     "write a number (80), a quoted string ('H100') or true/false")


def _literal(attribute: str, value: Any) -> Any:
    """A ``model`` literal as the table of GPU models spells it (``'h100'`` is ``H100``,
    ``'rtx-6000-ada'`` is ``RTX 6000 Ada``: docs/gpu-models.md); any other value as written."""
    found = known_model(value) if attribute == "model" and isinstance(value, str) else None
    return found.name if found is not None else value


def _compare(text: str, op: _Token, attribute: str, value: Any) -> Predicate:
    value = _literal(attribute, value)
    kind = ATTRIBUTES[attribute]
    ordered = op.text in ("<", "<=", ">", ">=")
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if ordered and (kind != "number" or not is_number):
        raise _error(text, op.pos, f"{op.text} compares numbers, but {attribute} is a {kind}",
                     "use == or != for strings and true/false")
    if kind == "number" and not is_number:
        raise _error(text, op.pos, f"{attribute} is a number, compared with {value!r}",
                     f"compare it with a number, as in {attribute} >= 80")
    if kind == "string" and not isinstance(value, str):
        raise _error(text, op.pos, f"{attribute} is a string, compared with {value!r}",
                     f"quote the value, as in {attribute} == 'H100'")
    if kind == "bool" and not isinstance(value, bool):
        raise _error(text, op.pos, f"{attribute} is true or false, compared with {value!r}",
                     f"write {attribute} == true")

    def predicate(attrs: Mapping[str, Any]) -> bool:
        have = attrs.get(attribute)
        if have is None:
            return op.text == "!=" and value is not None
        if op.text == "==":
            return bool(have == value)
        if op.text == "!=":
            return bool(have != value)
        if not isinstance(have, int | float):
            return False
        result: bool = {
            "<": have < value, "<=": have <= value, ">": have > value, ">=": have >= value,
        }[op.text]
        return result

    return predicate


def parse_selector(text: str) -> Selector:
    """Parse ``text`` once; raises InvalidInput naming the position and the fix."""
    if len(text) > MAX_LENGTH:
        raise InvalidInput(
            f"--selector of {len(text)} characters is too long: write a selector of at most "
            f"{MAX_LENGTH} characters (list values with `in [...]`)",
            data={"length": len(text), "max": MAX_LENGTH},
        )
    return Selector(text, _Parser(text).parse())
