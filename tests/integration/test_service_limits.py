"""What one tenant may hold (api/services/limits.py ``ServiceLimits``): read once from the
server's settings by the composition root, the defaults docs/security.md states, 0 for no
bound, and a value that is not a whole number refused at start, naming the variable."""

from __future__ import annotations

import pytest

from better_compute.api.runtime import Runtime
from better_compute.api.services.limits import ServiceLimits
from better_compute.domain.errors import InvalidInput
from tests.support import open_runtime

SETTINGS = [("BETTER_COMPUTE_RESERVATIONS_MAX_QUEUED", "max_queued", 100),
            ("BETTER_COMPUTE_TOKEN_MAX_PER_TENANT", "max_tokens_per_tenant", 1000)]


@pytest.mark.parametrize(("variable", "field", "default"), SETTINGS)
def test_a_bound_from_its_setting(variable: str, field: str, default: int) -> None:
    assert getattr(ServiceLimits.from_env({}), field) == default
    assert getattr(ServiceLimits.from_env({variable: "0"}), field) == 0
    assert getattr(ServiceLimits.from_env({variable: " 7 "}), field) == 7
    for bad in ("many", "-1", "1.5", "1e3"):
        with pytest.raises(InvalidInput, match=f"{variable}='{bad}' is not a whole number"):
            ServiceLimits.from_env({variable: bad})


@pytest.mark.parametrize(("variable", "field", "default"), SETTINGS)
def test_the_services_hold_what_the_runtime_read(env: dict[str, str], variable: str,
                                                 field: str, default: int) -> None:
    rt = open_runtime({**env, variable: "3"})
    try:
        assert getattr(rt.service.limits, field) == 3
        assert rt.services.reservations.queue.max_queued == rt.service.limits.max_queued
    finally:
        rt.close()
    with pytest.raises(InvalidInput, match=variable):
        Runtime.open({**env, variable: "many"})
