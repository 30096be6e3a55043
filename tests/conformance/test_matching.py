"""The expectation rules of the conformance scenarios (matching.py), on plain data."""

from __future__ import annotations

import pytest

from tests.conformance.matching import Mismatch, match, substitute


def test_an_object_matches_when_every_expected_key_matches_and_ignores_the_rest() -> None:
    assert match({"ok": True}, {"ok": True, "extra": 1}, {}) == {}
    with pytest.raises(Mismatch, match=r"\$\.outcome: missing"):
        match({"outcome": "OK"}, {"ok": True}, {})
    with pytest.raises(Mismatch, match=r"\$\.outcome: expected 'OK', got 'FENCED'"):
        match({"outcome": "OK"}, {"outcome": "FENCED"}, {})


def test_lists_match_item_by_item_and_length_by_length() -> None:
    assert match([1, {"a": 2}], [1, {"a": 2, "b": 3}], {}) == {}
    with pytest.raises(Mismatch, match="expected 1 items"):
        match([1], [1, 2], {})
    assert match("#2", [{"x": 1}, None], {}) == {}
    with pytest.raises(Mismatch, match="expected 3 items"):
        match("#3", [1, 2], {})


def test_a_placeholder_binds_on_first_use_and_must_agree_afterwards() -> None:
    bound = match({"generation": "$gen"}, {"generation": 7}, {})
    assert bound == {"gen": 7}
    assert match({"g": "$gen"}, {"g": 7}, bound) == bound
    with pytest.raises(Mismatch, match=r"\$gen = 7, got 8"):
        match({"g": "$gen"}, {"g": 8}, bound)
    with pytest.raises(Mismatch, match="anything but"):
        match({"g": "!$gen"}, {"g": 7}, bound)
    assert match({"g": "!$gen"}, {"g": 9}, bound) == bound


def test_a_failed_match_binds_nothing() -> None:
    # `until` steps retry: a try that did not match must not leave a binding behind.
    bindings = {"x": 1}
    with pytest.raises(Mismatch):
        match({"a": "$new", "b": 2}, {"a": 5, "b": 3}, bindings)
    assert bindings == {"x": 1}


def test_comparisons_with_bound_values_and_literals() -> None:
    bound = {"gen_a": 10}
    assert match({"g": ">$gen_a"}, {"g": 11}, bound) == bound
    with pytest.raises(Mismatch, match=r"expected >\$gen_a"):
        match({"g": ">$gen_a"}, {"g": 10}, bound)
    assert match({"n": "<=20", "m": ">=400", "k": "<3"}, {"n": 20, "m": 400, "k": 2}, {}) == {}
    with pytest.raises(Mismatch, match="expected a number"):
        match({"n": "<=20"}, {"n": "20"}, {})
    with pytest.raises(Mismatch, match="before a step bound it"):
        match({"g": ">$unbound"}, {"g": 1}, {})


def test_a_star_is_any_value_but_the_key_must_be_there() -> None:
    assert match({"reason": "*"}, {"reason": None}, {}) == {}
    with pytest.raises(Mismatch, match="missing"):
        match({"reason": "*"}, {}, {})


def test_values_must_be_equal_and_of_the_same_type() -> None:
    assert match({"lost": True, "result": None}, {"lost": True, "result": None}, {}) == {}
    with pytest.raises(Mismatch):
        match({"lost": True}, {"lost": 1}, {})
    with pytest.raises(Mismatch):
        match({"result": {"done": True}}, {"result": "done"}, {})


def test_substitute_sends_what_an_earlier_step_bound() -> None:
    args = {"task_id": "$tid", "input": ["$tid", 1], "queue": "q"}
    assert substitute(args, {"tid": "t-9"}) == {"task_id": "t-9", "input": ["t-9", 1], "queue": "q"}
    with pytest.raises(Mismatch, match="sent before a step bound it"):
        substitute({"task_id": "$tid"}, {})


def test_substitute_writes_an_oversized_value_small() -> None:
    assert substitute({"input": {"$repeat": "ab", "times": 3}}, {}) == {"input": "ababab"}
