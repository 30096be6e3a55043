"""The admission decision of long-lived calls, over every count around its bounds."""

from __future__ import annotations

import pytest

from coordinator.domain.stream_limits import (
    UNAUTHENTICATED_CALLERS,
    Admission,
    StreamLimits,
    admission,
    refusal_message,
)

LIMITS = StreamLimits(max_streams=4, max_per_principal=2)


@pytest.mark.parametrize("open_total", range(7))
@pytest.mark.parametrize("open_of_principal", range(4))
def test_admitted_only_below_both_bounds_and_the_principal_cap_named_first(
    open_total: int, open_of_principal: int
) -> None:
    decision = admission(LIMITS, open_total=open_total, open_of_principal=open_of_principal)
    if open_of_principal >= 2:
        # The caller's own cap is what it can act on (close one of its own), so it is named
        # even when the replica is full too.
        assert decision is Admission.PRINCIPAL_FULL
    elif open_total >= 4:
        assert decision is Admission.SERVER_FULL
    else:
        assert decision is Admission.ADMITTED


def test_refusals_name_the_bound_and_its_setting() -> None:
    principal = refusal_message(Admission.PRINCIPAL_FULL, LIMITS, "w-1")
    assert principal.startswith("principal 'w-1' already holds 2 open streams, the most")
    assert "max_streams_per_principal" in principal
    server = refusal_message(Admission.SERVER_FULL, LIMITS, "w-1")
    assert "this replica already serves 4 open streams, its limit (max_streams)" in server
    anonymous = refusal_message(Admission.PRINCIPAL_FULL, LIMITS, UNAUTHENTICATED_CALLERS)
    assert anonymous.startswith("unauthenticated callers (who share one count) already hold 2")
