"""GPU family (the pool's ``--gpu-model``) from a card's name: the one table of GPU models
(domain/gpu_models.py), through api/wire/gpu_family.py, where the wire's GPU value
(api/wire/inventory.py) derives it too."""

from better_compute.api.wire.gpu_family import FAMILIES, card_model, gpu_family, same_model

__all__ = ["FAMILIES", "card_model", "gpu_family", "same_model"]
