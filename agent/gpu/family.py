"""GPU family (the pool's ``--gpu-model``) from a card's name: api/wire/gpu_family.py, where the
wire's GPU value (api/wire/inventory.py) derives it too."""

from better_compute.api.wire.gpu_family import FAMILIES, gpu_family

__all__ = ["FAMILIES", "gpu_family"]
