"""The GPU models the product knows: ONE table, for the control plane and for bcd.

A pool holds one GPU model (``--gpu-model``); a reservation may ask for one (``--model``); bcd
reports each card's name as its driver prints it (NVML: "NVIDIA RTX 6000 Ada Generation") and
the model it belongs to. All of them read names through this module, so a card, a pool and a
request agree on what a model is (docs/gpu-models.md, whose table a test keeps equal to
``MODELS``).

Rules:

- A name is read token by token (letters and digits; case, spaces, hyphens, underscores and
  any other punctuation do not matter), and a model's spelling must cover whole tokens: "GH200"
  is not "H200", "H20" is not in "H200", "L40S" is not "L40", "A10G" is not "A10". A name in
  which two different models are found names none (no name in the table has another model's
  spelling in it: tests/unit/test_domain_gpus.py reads each as its own model).
- Distinct GPUs stay distinct: RTX 6000 Ada, RTX PRO 6000, RTX A6000 and Quadro RTX 6000 are
  four models, and "RTX 6000" alone names none of them (``AMBIGUOUS``).
- A name the table does not know is its own model: the card's name as its driver reports it.
  Two such names are one model when they are equal but for case, spacing and a leading
  vendor word ("NVIDIA", "AMD"); never is an unknown name read as a known model.
- ``LEGACY`` holds what earlier versions stored for a model; stored pools and reservations are
  read through it (``stored_model``), never a user's spelling.

bcd ships this module (scripts/build-bcd), so it imports the standard library only
(tests/unit/test_import_rules.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache


@dataclass(frozen=True)
class GpuModel:
    name: str  # how the product spells it: pools, listings, selectors, metrics
    vendor: str
    architecture: str
    reports: tuple[str, ...] = ()  # the names its driver reports (NVML, nvidia-smi)
    aliases: tuple[str, ...] = ()  # other spellings that name it (board names, short forms)


def _m(name: str, architecture: str, *reports: str, aliases: tuple[str, ...] = (),
       vendor: str = "NVIDIA") -> GpuModel:
    return GpuModel(name, vendor, architecture, reports, aliases)


MODELS: tuple[GpuModel, ...] = (
    _m("GB300", "Blackwell", "NVIDIA GB300"),
    _m("B300", "Blackwell", "NVIDIA B300 SXM6 AC"),
    _m("GB200", "Blackwell", "NVIDIA GB200"),
    _m("B200", "Blackwell", "NVIDIA B200"),
    _m("B100", "Blackwell", "NVIDIA B100"),
    _m("RTX PRO 6000", "Blackwell", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
       "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
       "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"),
    _m("RTX PRO 5000", "Blackwell", "NVIDIA RTX PRO 5000 Blackwell"),
    _m("RTX PRO 4500", "Blackwell", "NVIDIA RTX PRO 4500 Blackwell"),
    _m("RTX PRO 4000", "Blackwell", "NVIDIA RTX PRO 4000 Blackwell"),
    _m("GH200", "Hopper", "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"),
    _m("H200", "Hopper", "NVIDIA H200", "NVIDIA H200 NVL"),
    _m("H100", "Hopper", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
       aliases=("H100-SXM5-80GB",)),
    _m("H800", "Hopper", "NVIDIA H800", "NVIDIA H800 PCIe"),
    _m("H20", "Hopper", "NVIDIA H20"),
    _m("L40S", "Ada Lovelace", "NVIDIA L40S"),
    _m("L40", "Ada Lovelace", "NVIDIA L40"),
    _m("L20", "Ada Lovelace", "NVIDIA L20"),
    _m("L4", "Ada Lovelace", "NVIDIA L4"),
    _m("L2", "Ada Lovelace", "NVIDIA L2"),
    _m("RTX 6000 Ada", "Ada Lovelace", "NVIDIA RTX 6000 Ada Generation"),
    _m("RTX 5000 Ada", "Ada Lovelace", "NVIDIA RTX 5000 Ada Generation"),
    _m("RTX 4000 Ada", "Ada Lovelace", "NVIDIA RTX 4000 Ada Generation",
       "NVIDIA RTX 4000 SFF Ada Generation"),
    _m("RTX 4090", "Ada Lovelace", "NVIDIA GeForce RTX 4090"),
    _m("RTX 4080", "Ada Lovelace", "NVIDIA GeForce RTX 4080"),
    _m("A100X", "Ampere", "NVIDIA A100X"),
    _m("A100", "Ampere", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB",
       "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"),
    _m("A800", "Ampere", "NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe"),
    _m("A40", "Ampere", "NVIDIA A40"),
    _m("A30", "Ampere", "NVIDIA A30"),
    _m("A16", "Ampere", "NVIDIA A16"),
    _m("A10G", "Ampere", "NVIDIA A10G"),
    _m("A10M", "Ampere", "NVIDIA A10M"),
    _m("A10", "Ampere", "NVIDIA A10"),
    _m("A2", "Ampere", "NVIDIA A2"),
    _m("RTX A6000", "Ampere", "NVIDIA RTX A6000", aliases=("A6000",)),
    _m("RTX A5000", "Ampere", "NVIDIA RTX A5000", aliases=("A5000",)),
    _m("RTX A4000", "Ampere", "NVIDIA RTX A4000", aliases=("A4000",)),
    _m("RTX 3090", "Ampere", "NVIDIA GeForce RTX 3090"),
    _m("Quadro RTX 8000", "Turing", "Quadro RTX 8000", aliases=("RTX 8000",)),
    _m("Quadro RTX 6000", "Turing", "Quadro RTX 6000"),
    _m("T4", "Turing", "Tesla T4"),
    _m("V100S", "Volta", "Tesla V100S-PCIE-32GB"),
    _m("V100", "Volta", "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB",
       "Tesla V100-PCIE-32GB", "Tesla V100-SXM3-32GB"),
    _m("P100", "Pascal", "Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB"),
    _m("P40", "Pascal", "Tesla P40"),
    _m("P4", "Pascal", "Tesla P4"),
    _m("K80", "Kepler", "Tesla K80"),
    _m("MI300X", "CDNA 3", "AMD Instinct MI300X", vendor="AMD"),
    _m("MI250X", "CDNA 2", "AMD Instinct MI250X", vendor="AMD"),
)

# Spellings that several models share: refused with the choice, never guessed.
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "RTX 6000": ("RTX 6000 Ada", "RTX PRO 6000", "RTX A6000", "Quadro RTX 6000"),
    "RTX 5000": ("RTX 5000 Ada", "RTX PRO 5000", "RTX A5000"),
    "RTX 4000": ("RTX 4000 Ada", "RTX PRO 4000", "RTX A4000"),
}

# Models as earlier versions stored them (domain/gpus.py's compact names) -> the model now.
# "RTX6000" came from "RTX 6000 Ada" (and "RTX 6000 Ada Generation"), the card the old code
# meant; a Quadro RTX 6000 pool made then must be made again (docs/gpu-models.md).
LEGACY: dict[str, str] = {"RTX6000": "RTX 6000 Ada"}

VENDOR_WORDS = ("NVIDIA", "AMD")
# The words a driver's name for a GPU starts with: how a GPU the table does not know is given.
DRIVER_WORDS = ("NVIDIA", "AMD", "Tesla", "Quadro", "GeForce", "Intel")
MAX_NAME = 128  # a longer text names no GPU (and is never cached)
_TOKEN = re.compile(r"[A-Z0-9]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.upper())


def _compact(text: str) -> str:
    """The letters and digits of a name, upper case, without a leading vendor word."""
    tokens = _tokens(text)
    if len(tokens) > 1 and tokens[0] in VENDOR_WORDS:
        tokens = tokens[1:]
    return "".join(tokens)


@cache
def _index() -> tuple[dict[str, GpuModel], int]:
    """Every spelling's compact form -> its model, and the most tokens a spelling has."""
    index: dict[str, GpuModel] = {}
    longest = 1
    for model in MODELS:
        for spelling in (model.name, *model.aliases, *model.reports):
            index["".join(_tokens(spelling))] = model
            longest = max(longest, len(_tokens(spelling)))
    return index, longest


def known_model(text: str | None) -> GpuModel | None:
    """The table's model a name or spelling names, or None (unknown, too long, or two models
    in it).

    >>> known_model("NVIDIA RTX 6000 Ada Generation").name, known_model("h100-sxm5-80gb").name
    ('RTX 6000 Ada', 'H100')
    """
    return _known(text) if text and len(text) <= MAX_NAME else None


@lru_cache(maxsize=4096)
def _known(text: str) -> GpuModel | None:
    tokens = _tokens(text)
    index, longest = _index()
    found: set[GpuModel] = set()
    for start in range(len(tokens)):
        joined = ""
        for token in tokens[start:start + longest]:
            joined += token
            if joined in index:
                found.add(index[joined])
    return found.pop() if len(found) == 1 else None


def ambiguous(text: str) -> tuple[str, ...]:
    """The models a spelling could mean when it names none of them alone ("RTX 6000")."""
    wanted = _compact(text)
    return next((models for spelling, models in AMBIGUOUS.items()
                 if _compact(spelling) == wanted), ())


def clean(text: str | None) -> str:
    """A name as shown: surrounding and repeated whitespace removed."""
    return " ".join((text or "").split())


def card_model(name: str | None, family: str | None = None) -> str | None:
    """A GPU's model from what bcd reported: the table's model in its name, else in its
    reported ``family``; else that family or, without one, the name itself (an unknown GPU is
    its own model); None when it reported neither."""
    if len(name or "") > MAX_NAME or len(family or "") > MAX_NAME:
        return _card_model(name, family)
    return _cached_card_model(name, family)


def _card_model(name: str | None, family: str | None) -> str | None:
    for text in (name, family):
        found = known_model(text)
        if found is not None:
            return found.name
    return clean(family) or clean(name) or None


_cached_card_model = lru_cache(maxsize=4096)(_card_model)


def stored_model(text: str | None) -> str | None:
    """A model as a stored pool or reservation holds it, read with today's names."""
    if not text:
        return None
    return LEGACY.get(_compact(text), text)


def model_key(text: str | None) -> str:
    """What every spelling of one model shares: compare models by this."""
    found = known_model(text)
    return _compact(found.name) if found is not None else _compact(text or "")


def is_driver_name(text: str) -> bool:
    """Could ``text`` be the name a driver reports for a GPU: a word of ``DRIVER_WORDS``,
    then letters, digits, spaces and ``. _ - / + ( )``, at most ``MAX_NAME`` characters?"""
    return len(text) <= MAX_NAME and _DRIVER_NAME.fullmatch(text) is not None


_DRIVER_NAME = re.compile(rf"(?i)({'|'.join(DRIVER_WORDS)})[ ._-]+[A-Za-z0-9][A-Za-z0-9 ._/+()-]*")


def same_model(a: str | None, b: str | None) -> bool:
    """Do two spellings (a pool's, a request's, a card's) name the same model?"""
    return bool(a) and bool(b) and model_key(a) == model_key(b)


def model_names() -> tuple[str, ...]:
    return tuple(model.name for model in MODELS)
