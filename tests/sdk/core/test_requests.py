"""The create request the SDKs build (pure): ``depends_on`` as a caller would write it."""

from __future__ import annotations

import pytest

from coordinator.sdk._core.requests import create_request

_PLAIN = {"input": b"x", "queue": "q", "priority": 0, "requires_review": False}


@pytest.mark.parametrize(
    ("given", "sent"), [(None, []), ((), []), (["a", "b"], ["a", "b"]), (("a",), ["a"])]
)
def test_depends_on_none_means_no_upstream(given: object, sent: list[str]) -> None:
    """None, the natural "no dependencies", raised TypeError ('NoneType' is not iterable)."""
    request = create_request("t", non_replayable=False, depends_on=given, **_PLAIN)  # type: ignore[arg-type]
    assert list(request.depends_on) == sent


@pytest.mark.parametrize("given", ["up", b"up"])
def test_a_lone_id_is_refused_not_split_into_letters(given: object) -> None:
    with pytest.raises(TypeError, match="depends_on takes a list of task ids, got a"):
        create_request("t", non_replayable=False, depends_on=given, **_PLAIN)  # type: ignore[arg-type]
