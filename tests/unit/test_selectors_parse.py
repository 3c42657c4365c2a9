"""The selector language: what it accepts, what it selects, and how it explains errors."""

from __future__ import annotations

import pytest

from better_compute.domain.errors import InvalidInput
from better_compute.domain.selectors import parse_selector

H100 = {"vramGiB": 80, "model": "H100", "product": "H100-SXM5-80GB", "name": "NVIDIA H100",
        "nvlinkDomain": "host/nvswitch", "index": 3, "healthy": True}
L4 = {"vramGiB": 24, "model": "L4", "product": "L4", "name": "NVIDIA L4", "nvlinkDomain": None,
      "index": 0, "healthy": True}


@pytest.mark.parametrize(("text", "h100", "l4"), [
    ("vramGiB >= 80", True, False),
    ("vramGiB < 80", False, True),
    ("model == 'H100'", True, False),
    ('model != "H100"', False, True),
    ("model in ['L4', 'L40S']", False, True),
    ("vramGiB >= 20 and not model == 'L4'", True, False),
    ("model == 'L4' or index == 3", True, True),
    ("(model == 'L4' or index == 3) and vramGiB > 50", True, False),
    ("nvlinkDomain == 'host/nvswitch'", True, False),
    ("nvlinkDomain != 'host/nvswitch'", False, True),
    ("healthy == true", True, True),
    ("vramGiB >= 79.5", True, False),
])
def test_selects(text: str, h100: bool, l4: bool) -> None:
    selector = parse_selector(text)
    assert (selector.matches(H100), selector.matches(L4)) == (h100, l4)


def test_a_missing_attribute_compares_false() -> None:
    assert not parse_selector("vramGiB >= 1").matches({"model": "H100"})


@pytest.mark.parametrize(("text", "position", "words"), [
    ("", 1, "empty"),
    ("vram >= 80", 1, "unknown attribute 'vram'"),
    ("vramGiB >=", 11, "expected a value"),
    ("model == H100", 10, "quoted string"),
    ("model > 'H100'", 7, "compares numbers"),
    ("vramGiB == 'big'", 9, "is a number"),
    ("(vramGiB > 1", 13, "missing ')'"),
    ("vramGiB > 1 vramGiB < 3", 13, "join conditions with and / or"),
    ("model == 'H100", 10, "not closed"),
    ("vramGiB @ 3", 9, "unexpected character '@'"),
    ("vramGiB 80", 9, "expected a comparison"),
    ("model in 'H100'", 10, "expected '['"),
])
def test_parse_errors_name_the_position_and_the_fix(text: str, position: int, words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_selector(text)
    assert words in err.value.message
    assert f"at position {position}" in err.value.message
    assert err.value.data["position"] == position
    assert "\n" not in err.value.message
