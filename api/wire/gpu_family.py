"""GPU family (the pool's ``--gpu-model``) derived from the name a card reports, by the ONE
table of GPU models, domain/gpu_models.py: a standard-library-only module of the domain that
bcd ships beside the wire schemas (scripts/build-bcd; tests/unit/test_import_rules.py allows
this one import of the domain)."""

from __future__ import annotations

from better_compute.domain.gpu_models import card_model, known_model, model_names, same_model

FAMILIES: tuple[str, ...] = model_names()

__all__ = ["FAMILIES", "card_model", "gpu_family", "same_model"]


def gpu_family(name: str | None) -> str | None:
    """The table's model of a GPU name, or None when the table does not know the card.

    >>> gpu_family("NVIDIA H100 80GB HBM3"), gpu_family("NVIDIA RTX 6000 Ada Generation")
    ('H100', 'RTX 6000 Ada')
    """
    found = known_model(name)
    return found.name if found is not None else None
