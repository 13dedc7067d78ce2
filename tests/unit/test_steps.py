"""The step registry (wheelmill.building.steps): what each entry needs is made before it, in
the registry's order (the plan's), and a step sees only the products its entry declares."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wheelmill.building.products import PRODUCTS, Fetched, Sources
from wheelmill.building.report import Done
from wheelmill.building.steps import BY_KIND, REGISTRY, RecipeStep, unmet_needs
from wheelmill.planning.spec import StepKind


def test_every_need_is_made_by_an_entry_before_it() -> None:
    assert unmet_needs(REGISTRY) == []


def test_two_entries_swapped_are_named() -> None:
    """The check itself: fetch after build leaves the build without its source."""
    order = list(REGISTRY)
    fetch, build = order.index(BY_KIND[StepKind.FETCH]), order.index(BY_KIND[StepKind.BUILD])
    order[fetch], order[build] = order[build], order[fetch]
    assert unmet_needs(order) == ["build needs Fetched, made only later by fetch"]


def test_a_need_nothing_makes_is_named() -> None:
    fetch = BY_KIND[StepKind.FETCH]
    assert isinstance(fetch, RecipeStep)
    order = [replace(d, makes=()) if d is fetch else d for d in REGISTRY]
    assert "build needs Fetched, made by no step" in unmet_needs(order)


def test_every_declared_product_is_a_product_and_every_product_is_made() -> None:
    declared = {p for d in REGISTRY for p in (*d.needs, *d.makes, *d.reads)}
    assert declared <= set(PRODUCTS)
    assert {p for d in REGISTRY for p in d.makes} == set(PRODUCTS)


def test_a_step_sees_only_what_its_entry_declares() -> None:
    view = Done([]).only(BY_KIND[StepKind.FETCH].needs, step="fetch")
    assert view.find(Sources) is None  # declared: looked up, none made yet
    with pytest.raises(LookupError, match="fetch looks up a Fetched, which its registry entry does not declare"):
        view.find(Fetched, "torchsort")
