"""A case's inputs (opforge.cases.arguments.make_inputs): the values of the last case built are reused by the next
build of the same case, and every build still hands out tensors of its own."""

from __future__ import annotations

import pytest
import torch
from helpers import SPECS

from opforge.building.op import load_op
from opforge.cases import arguments
from opforge.cases.arguments import make_inputs
from opforge.cases.matrix import Case
from opforge.loading.spec import load_spec


@pytest.fixture(scope="module")
def in_place_op():
    # leaky_swish_ writes its argument, and its reference (leaky_swish_'s reference_) returns the written value.
    return load_op(load_spec(SPECS / "leaky_swish_.yaml"))


@pytest.fixture
def draws(monkeypatch):
    """How many times a case's values were drawn (not taken from the last build)."""
    drawn = {"count": 0}
    draw = arguments._drawn_values

    def counting(*args, **kwargs):
        drawn["count"] += 1
        return draw(*args, **kwargs)

    monkeypatch.setattr(arguments, "_drawn_values", counting)
    arguments._memo.clear()
    yield drawn
    arguments._memo.clear()


def case_of(shape: tuple[int, ...], dtype: str = "float64", layout: str = "contiguous", fill: str = "") -> Case:
    return Case(dtype, "cpu", layout, (("self", shape),), (("alpha", 0.1),), 0, 0, fill=fill)


def build(loaded, case: Case, seed: int = 0):
    return make_inputs(loaded.spec, loaded.arguments, case, seed, False, loaded.generators, loaded.samples)


@pytest.mark.parametrize(
    ("dtype", "layout"), [("float64", "contiguous"), ("bfloat16", "strided"), ("float32", "offset:1")]
)
def test_a_case_built_again_reuses_its_values_and_each_build_owns_its_tensors(in_place_op, draws, dtype, layout):
    case = case_of((33, 65), dtype, layout, fill="sorted")
    first = build(in_place_op, case)
    pristine = (first.args[0].clone(), first.reference_args[0].clone())
    # The op writes its argument, and a reference may write its own: neither may reach the next build.
    in_place_op.implementations[0].fn(*first.args)
    first.reference_args[0].mul_(-3)
    second = build(in_place_op, case)
    assert draws["count"] == 1
    assert second.args[0].data_ptr() != first.args[0].data_ptr()
    assert second.args[0].stride() == first.args[0].stride() and second.args[0].dtype == first.args[0].dtype
    assert torch.equal(second.args[0], pristine[0]) and torch.equal(second.reference_args[0], pristine[1])


def test_another_seed_or_case_is_drawn_anew(in_place_op, draws):
    build(in_place_op, case_of((7,)))
    build(in_place_op, case_of((7,)), seed=1)
    build(in_place_op, case_of((8,)), seed=1)
    assert draws["count"] == 3
    assert not torch.equal(build(in_place_op, case_of((7,))).args[0], build(in_place_op, case_of((7,)), 1).args[0])


def test_a_case_past_the_size_limit_is_not_kept(in_place_op, draws, monkeypatch):
    monkeypatch.setattr(arguments, "MEMO_MAX_ELEMENTS", 100)
    build(in_place_op, case_of((10, 10)))
    build(in_place_op, case_of((10, 10)))
    build(in_place_op, case_of((11, 10)))
    build(in_place_op, case_of((11, 10)))
    assert draws["count"] == 3
