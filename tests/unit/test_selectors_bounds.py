"""Hostile selectors: bounded length, nesting and numbers, linear parsing.

A read-only token may send any ``--selector`` to ``capacity.preview``: the
parser must never copy the rest of the text per token (quadratic), never
recurse without bound, and never let a RecursionError or ValueError through
(they become ``internal``). Every refusal is InvalidInput naming the bound.
"""

from __future__ import annotations

from typing import Any, SupportsIndex

import pytest

from better_compute.domain import selectors
from better_compute.domain.errors import InvalidInput
from better_compute.domain.selectors import MAX_DEPTH, MAX_LENGTH, parse_selector


class CountingStr(str):
    """A selector text that counts the characters copied out of it by slicing."""

    copied = 0

    def __getitem__(self, key: SupportsIndex | slice) -> Any:
        got = str.__getitem__(self, key)
        CountingStr.copied += len(got)
        return got


def test_tokenizing_copies_each_character_a_bounded_number_of_times() -> None:
    text = " or ".join(["index == 1"] * 70)  # about 1,000 characters, 280 tokens
    assert len(text) <= MAX_LENGTH
    CountingStr.copied = 0
    tokens = selectors._tokenize(CountingStr(text))
    assert len(tokens) == 70 * 3 + 69 + 1
    assert CountingStr.copied <= 2 * len(text), CountingStr.copied


def test_a_selector_over_the_length_cap_is_refused_before_parsing() -> None:
    text = " or ".join(["vramGiB >= 80"] * 25_000)  # 400 KB, the size that stalled the API
    with pytest.raises(InvalidInput) as err:
        parse_selector(text)
    assert f"at most {MAX_LENGTH} characters" in err.value.message
    assert len(err.value.message) < 500  # the text is not echoed whole


@pytest.mark.parametrize("text", [
    "(" * 500 + "index == 1" + ")" * 500,
    "not " * 250 + "healthy == true",
    "(not " * 150 + "index == 1" + ")" * 150,
])
def test_deep_nesting_is_an_input_error(text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_selector(text)
    assert "nest" in err.value.message


def test_nesting_up_to_the_limit_parses() -> None:
    text = "(" * MAX_DEPTH + "index == 1" + ")" * MAX_DEPTH
    assert parse_selector(text).matches({"index": 1})
    assert parse_selector("not " * MAX_DEPTH + "index == 1").matches({"index": 1}) == (
        MAX_DEPTH % 2 == 0)


@pytest.mark.parametrize("literal", ["9" * 5000, "1" * 40, "1." + "5" * 400])
def test_huge_numbers_are_an_input_error(literal: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_selector(f"vramGiB >= {literal}"[:MAX_LENGTH])
    assert "number" in err.value.message


def test_long_flat_selectors_under_the_cap_still_parse() -> None:
    values = ", ".join(str(i) for i in range(200))
    assert parse_selector(f"index in [{values}]").matches({"index": 199})
    chain = " and ".join(["vramGiB >= 1"] * 55)
    assert parse_selector(chain).matches({"vramGiB": 80})
