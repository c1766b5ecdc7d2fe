"""The search space of `opforge fuzz`, from the spec alone: hypothesis strategies that draw one example, a
`Regression` (the same record `--save` keeps in the spec), without torch.

Shapes start from each declared pairing of the spec (or each sample of a `samples:` spec, whose shapes the sample
function fixes) and rename its sizes consistently across inputs: equal sizes stay equal, so broadcast and matmul
partners stay valid; the reference then decides whether the drawn call is in the op's domain. Every strategy
shrinks towards the simple end: small sizes, the first pairing, the contiguous layout, the spec's own values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from opforge.cases.matrix import FILL_RULES, FILL_SPECIALS, LAYOUT_FAMILY, layout_applies
from opforge.core.schema import mutated_names
from opforge.fuzz.options import DEFAULT_MAX_NUMEL
from opforge.spec.model import OpSpec, Regression, ScalarInput

# A size is drawn as blocks * block + rest, the block a power of two: hypothesis biases each draw towards its ends,
# so the sizes kernels get wrong come often (0, 1, 2^k, 2^k - 1 with rest at its top, 2^k + 1 with one block and
# rest 1; primes among the rest), up to 4096 per dimension. The form is also what lets the shrinker reach the
# smallest failing size of a bug that depends on a size's remainder (a vector loop's tail): it shrinks `blocks` to 0
# and keeps `rest`, where shrinking the plain number (halving, subtracting 1 or 2) stops at the first size that
# passes (1175 -> 587 for a tail bug at sizes 8k + 7).
MAX_SIZE = 4096
# The storage offsets tried: every alignment of a 16-byte vector load for every element size down to 2 bytes.
MAX_OFFSET = 7


@dataclass(frozen=True)
class Space:
    """What the worker found the spec's calls to be: each pairing's shapes by tensor input (a samples spec's from
    its function), and which tensor inputs take special values (floating, sampled by opforge)."""

    pairings: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]
    special_inputs: tuple[str, ...]
    sampled: bool


def size_limit(max_numel: int) -> int:
    """The largest size of one dimension: MAX_SIZE, or `max_numel` itself when a run raises it past the default
    (a 1-D input past a kernel's grid cap: `--max-numel 33554432`)."""
    return MAX_SIZE if max_numel <= DEFAULT_MAX_NUMEL else max_numel


@st.composite
def sizes(draw: Any, limit: int = MAX_SIZE) -> int:
    """A dimension size, 0 to `limit`; blocks up to a sixteenth of it."""
    block = draw(st.sampled_from(_powers_of_two(limit // 16) or (1,)))
    return int(draw(st.integers(0, limit // block)) * block + draw(st.integers(0, block - 1)))


def _powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(2**k for k in range(max(0, limit).bit_length()))


def examples(spec: OpSpec, space: Space, device: str, max_numel: int) -> st.SearchStrategy[Regression]:
    dtypes = tuple(d for d in spec.dtypes if d in spec.dtypes_on(device))
    scalars = [i for i in spec.inputs if isinstance(i, ScalarInput)]

    @st.composite
    def draw_example(draw: Any) -> Regression:
        index = draw(st.integers(0, len(space.pairings) - 1))
        pairing = space.pairings[index]
        shapes = (
            pairing if space.sampled else _renamed(draw, pairing, max_numel, broadcast=not mutated_names(spec.schema))
        )
        dtype = draw(st.sampled_from(dtypes))
        return Regression(
            dtype=dtype,
            device=device,
            layout=draw(_layouts(spec, shapes)),
            shapes=() if space.sampled else shapes,
            values=tuple((s.name, draw(st.sampled_from(s.values))) for s in scalars),
            fill=draw(_fills(space, dtype)),
            seed=draw(st.integers(0, 2**32 - 1)),
            sample=index if space.sampled else None,
        )

    return draw_example()


def _renamed(
    draw: Any, pairing: tuple[tuple[str, tuple[int, ...]], ...], max_numel: int, broadcast: bool
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The pairing with each distinct size above 1 either kept or replaced by a drawn one (the same everywhere it
    appears), the largest sizes halved (everywhere) until all inputs hold at most `max_numel` elements together, and
    maybe one dimension of one input set to 1: a broadcast the reference may accept (not for an op that writes into
    an argument, whose shape follows the inputs').

    Keeping a size half the time keeps the sizes a spec couples without saying so valid together often enough (an
    LSTM's 4 * hidden beside hidden, the 5 columns of an RoI list, a generator's largest count): renaming every size
    made 97% of lstm_cell's and 99.9% of nms's examples calls their references refused."""
    distinct = sorted({size for _, shape in pairing for size in shape if size > 1})
    limit = size_limit(max_numel)
    # Drawn when the boolean is False, towards which hypothesis shrinks: a failure at the spec's own sizes then
    # shrinks below them, as a drawn size does (kept when True, a fake's wrong strides on the spec's transposed
    # [33, 65] stayed there as the minimal example).
    renamed = {size: size if draw(st.booleans()) else draw(sizes(limit)) for size in distinct}

    def shapes_now() -> list[list[int]]:
        return [[renamed.get(size, size) for size in shape] for _, shape in pairing]

    while sum(math.prod(shape) for shape in shapes_now()) > max_numel:
        largest = max(renamed, key=lambda size: renamed[size])
        renamed[largest] //= 2
    shapes = shapes_now()
    ones = [(i, d) for i, shape in enumerate(shapes) for d in range(len(shape)) if shape[d] > 1]
    if broadcast and ones and draw(st.booleans()):
        i, d = draw(st.sampled_from(ones))
        shapes[i][d] = 1
    return tuple((name, tuple(shape)) for (name, _), shape in zip(pairing, shapes))


def _layouts(spec: OpSpec, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> st.SearchStrategy[str]:
    """The layouts some input of these shapes can take, in the spec's layout families; contiguous first."""
    rank = max((len(shape) for _, shape in shapes), default=0)
    candidates = ["contiguous", *(f"offset:{k}" for k in range(1, MAX_OFFSET + 1)), "strided", "expanded"]
    candidates += ["channels_last"] + [f"transposed:{i},{j}" for i in range(rank) for j in range(i + 1, rank)]
    usable = [
        layout
        for layout in candidates
        if LAYOUT_FAMILY[layout.split(":")[0]] in spec.layouts
        and any(layout_applies(layout, shape) for _, shape in shapes)
    ]
    return st.sampled_from(usable or ["contiguous"])


def _fills(space: Space, dtype: str) -> st.SearchStrategy[str]:
    """The spec's values as sampled (""), a rule over them, or a special value in one input: at one position, over
    one row of its last dimension, or everywhere."""
    if dtype not in ("float16", "bfloat16", "float32", "float64"):
        return st.just("")
    rules = st.sampled_from(("", *FILL_RULES))
    if not space.special_inputs:
        return rules
    special = st.sampled_from(tuple(FILL_SPECIALS))
    name = st.sampled_from(space.special_inputs)
    where = st.integers(0, DEFAULT_MAX_NUMEL)
    one = st.builds(lambda n, s, p: f"{n}=one:{s}@{p}", name, special, where)
    row = st.builds(lambda n, s, p: f"{n}=row:{s}@{p}", name, special, where)
    whole = st.builds(lambda n, s: f"{n}=all:{s}", name, special)
    return st.one_of(rules, one, row, whole)
