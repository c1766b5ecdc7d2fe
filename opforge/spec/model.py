"""The spec model: what a YAML spec says, as frozen dataclasses, and the vocabulary specs are written in.

Nothing here reads files or imports torch (opforge.loading.spec builds these from YAML).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opforge.core.errors import SpecError

SPEC_SUFFIXES = (".yaml", ".yml")

FLOATING_DTYPES = ("float32", "float64", "float16", "bfloat16")
OTHER_DTYPES = ("complex64", "complex128", "int8", "int16", "int32", "int64", "uint8", "bool")
KNOWN_DTYPES = FLOATING_DTYPES + OTHER_DTYPES
# Stands for the dtype of the case under test: a `ScalarType` argument's value (`inputs.<arg>.values`, or a samples
# function's own `dtype` argument returned as the value), and a tensor input's `dtype:` (an index a samples function
# makes in int64 that follows the int32 and int64 cases).
CASE_DTYPE = "case_dtype"
KNOWN_DEVICES = ("cpu", "cuda")
KNOWN_LAYOUTS = ("contiguous", "noncontiguous", "channels_last")
# The layouts a benchmark can time: memory formats a tensor is made in (a view's non-contiguity is a check's case,
# not a format a model runs in).
BENCH_LAYOUTS = ("contiguous", "channels_last")
# What special_values writes into floating inputs, by the names a spec's `special_values:` picks them with.
SPECIAL_VALUES = (
    "nan",
    "inf",
    "-inf",
    "negative_zero",
    "zero",
    "subnormal",
    "negative_subnormal",
    "max",
    "-max",
    "smallest_normal",
)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class Avoid:
    """Keep sampled values at least `margin` away from each of `values` (a kink, a pole, a branch cut).

    With `relative_to`, the distance is measured on `this - other`, for kinks of a difference such as custom_loss's
    `pred - target`.
    """

    values: tuple[float, ...]
    margin: float
    relative_to: str | None = None


@dataclass(frozen=True)
class TensorInput:
    name: str
    # One shape per case's pairing; None where a sample leaves this optional (`Tensor?`) argument None.
    shapes: tuple[tuple[int, ...] | None, ...]
    low: float
    high: float
    requires_grad: bool
    avoid: Avoid | None = None
    # A fixed dtype (an index tensor, a mask) instead of the dtype under test.
    dtype: str | None = None
    # `dtype: case_dtype`: the dtype under test even where a samples function makes it in an integer dtype (which
    # otherwise keeps that dtype in every case).
    follows_case_dtype: bool = False
    # The layouts this input takes (the cases' other layouts leave it contiguous); None: the spec's `layouts`.
    layouts: tuple[str, ...] | None = None
    # `module:function` that makes the values (valid boxes, sorted indices...) instead of uniform sampling.
    generator: str | None = None
    # Whether special_values writes into it, or which of them (SPECIAL_VALUES names); None: the spec's choice,
    # unless a generator makes it (structured values).
    special_values: bool | tuple[str, ...] | None = None

    is_tensor = True

    @property
    def takes_special_values(self) -> bool:
        if self.special_values is None:
            return self.generator is None
        return bool(self.special_values)

    def special_value_names(self, spec_choice: tuple[str, ...]) -> tuple[str, ...]:
        """The special values written into this input: its own list, else the spec's."""
        return self.special_values if isinstance(self.special_values, tuple) else spec_choice


@dataclass(frozen=True)
class ScalarInput:
    name: str
    values: tuple[Any, ...]

    is_tensor = False


Input = TensorInput | ScalarInput


@dataclass(frozen=True)
class ErrorTensor:
    """One tensor argument of an invalid call; what is left out comes from the spec's first case."""

    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None


@dataclass(frozen=True)
class ErrorInput:
    """An invalid call and the error it must raise: an exception class named in Python's builtins, whose message
    contains `match` (a plain substring)."""

    description: str
    tensors: tuple[ErrorTensor, ...]
    values: tuple[tuple[str, Any], ...]
    error: str
    match: str

    @property
    def label(self) -> str:
        return re.sub(r"\W+", "_", self.description.strip().lower()).strip("_")


# What an xfail's `layout` may name: a case's layout, or the spec's `noncontiguous`, which stands for both of its views.
# The matrix's layouts, noncontiguous for both of its views, and expanded, a layout only fuzz draws.
XFAIL_LAYOUTS = ("contiguous", "offset", "transposed", "strided", "channels_last", "noncontiguous", "expanded")


@dataclass(frozen=True)
class XFail:
    """A known failure. Strict (the default): a case that passes anyway is XPASS and fails the run, so stale
    entries get noticed. Non-strict: for failures that depend on the sampled values, a pass is just a pass.
    `case` is a glob (fnmatch) on the case id, for a failure that only some shapes or samples have. `crash`: the
    failure is the op's process dying or hanging (a CRASH or TIMEOUT result), which only such an entry declares."""

    check: str
    reason: str
    implementation: str | None = None
    dtype: str | None = None
    device: str | None = None
    layout: str | None = None
    case: str | None = None
    strict: bool = True
    crash: bool = False

    def matches(self, implementation: str, check: str, dtype: str, device: str, layout: str, case_id: str) -> bool:
        base = check.split(":", 1)[0]
        return (
            self.check in (check, base)
            and (self.implementation is None or self.implementation == implementation)
            and (self.dtype is None or self.dtype == dtype)
            and (self.device is None or self.device == device)
            and (self.layout is None or layout_kind(layout) in _LAYOUT_FAMILIES.get(self.layout, (self.layout,)))
            and (self.case is None or fnmatch.fnmatchcase(case_id, self.case))
        )


# Every layout that is not contiguous: the matrix's two views and fuzz's expanded one.
_LAYOUT_FAMILIES = {"noncontiguous": ("transposed", "strided", "expanded")}


def layout_kind(layout: str) -> str:
    """`transposed:0,2` -> `transposed`: a regression case's or fuzz example's layout names its parameter, an
    xfail names the kind."""
    return layout.split(":", 1)[0]


BENCH_MODES = ("fwd", "bwd", "fwd+bwd")
# The contenders opforge bench times beside an op: its eager reference and torch.compile of it.
BENCH_BASELINES = ("eager", "compile")


@dataclass(frozen=True)
class BenchSlower:
    """A point where an implementation is known to be slower than a baseline, and why (`bench.slower`): it is
    listed, but `--fail-slower-than` does not fail on it. `case` is a glob (fnmatch) on the point as a result id
    shows it (`bwd-float32-cuda-n=2^24`); none: every point. An entry that matches no slower point is not an error:
    a launch-bound point is slower on one GPU and faster on another."""

    than: str
    reason: str
    case: str | None = None
    implementation: str | None = None

    def covers(self, implementation: str, baseline: str, point: str) -> bool:
        return (
            self.than == baseline
            and self.implementation in (None, implementation)
            and (self.case is None or fnmatch.fnmatchcase(point, self.case))
        )


@dataclass(frozen=True)
class BenchSpec:
    """What `opforge bench` times. Empty fields take defaults from the rest of the spec (see opforge.bench.runner).

    `sizes` gives every tensor input one shape of the spec's own ranks holding n elements (cases.matrix.grown_shapes);
    `shapes` gives each tensor input its own shapes, paired by position like `inputs`. `bytes` maps a mode to an
    expression of the bytes one call moves (opforge.spec.bytes_expr).
    """

    sizes: tuple[int, ...] = ()
    shapes: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()
    bytes: tuple[tuple[str, str], ...] = ()
    slower: tuple[BenchSlower, ...] = ()
    # Line and key (`bench.bytes` or `bench.bytes.<mode>`) of each `bench.bytes` expression, for errors found when
    # it is evaluated.
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    # What the loader read but would rather see written otherwise (an old key name), each with its file:line.
    warnings: tuple[str, ...] = field(default=(), compare=False)
    keys: tuple[tuple[str, str], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Load:
    """How the op gets registered: Python modules to import, C++/CUDA sources to build, and what building needs."""

    python_modules: tuple[str, ...] = ()
    sources: tuple[Path, ...] = ()
    # Extra header directories, libraries to link (a name for -l<name>, or a library file) and compiler flags: an op
    # wrapping an external C/C++ library.
    include_dirs: tuple[Path, ...] = ()
    libraries: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    # Directories (relative to the spec) put first on the import path: the root of a package the spec checks.
    path: tuple[Path, ...] = ()
    # The extension module the sources build, as a package imports it (`mypkg._C`); None: a plain op library.
    module: str | None = None


@dataclass(frozen=True)
class Samples:
    """`samples: module:function`: the cases' inputs come from a function (OpInfo's sample inputs), for ops whose
    shapes are coupled to their other arguments (a convolution's offsets to its stride and groups). `values` holds
    each sample's non-tensor arguments (CASE_DTYPE for the function's own `dtype`), and `names` each sample's short
    name ("" where it gives none), once the op is loaded (opforge.building.op): the spec alone cannot know them."""

    ref: str
    values: tuple[tuple[tuple[str, Any], ...], ...] = ()
    names: tuple[str, ...] = ()
    # `samples: {function: ..., file: PATH}`: the file the function reads its samples from, passed as `file=`.
    file: Path | None = None


@dataclass(frozen=True)
class Regression:
    """One case kept in the spec's `regressions:` (what `opforge fuzz --save` writes): run by every check that runs
    each case of the matrix, with exactly the values it was found with."""

    dtype: str
    device: str
    layout: str
    # Each tensor input's shape; empty for a sample spec's regression, whose shapes are its sample's.
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    # Non-tensor arguments; a missing one takes its first `values:` entry.
    values: tuple[tuple[str, Any], ...]
    fill: str
    seed: int
    sample: int | None = None
    # What was wrong when it was found (fuzz's message): documentation, never compared.
    found: str = ""


@dataclass(frozen=True)
class OpSpec:
    path: Path
    op: str
    schema: str
    load: Load
    implementations: tuple[tuple[str, str], ...]
    # `module:function`; None: the op itself on contiguous float64 copies of its inputs
    # (opforge.building.self_reference).
    reference: str | None
    inputs: tuple[Input, ...]
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    layouts: tuple[str, ...]
    tolerances: tuple[tuple[str, Tolerance], ...]
    grad_tolerances: tuple[tuple[str, Tolerance], ...]
    checks: tuple[str, ...]
    xfail: tuple[XFail, ...]
    differentiable: bool
    double_backward: bool
    description: str = ""
    # False declares results that may differ run to run (atomics, sampling): the determinism check then does not apply.
    deterministic: bool = True
    # Claims that switch on the vmap and error_inputs checks.
    vmap: bool = False
    error_inputs: tuple[ErrorInput, ...] = ()
    # The sections the checks own (`large_index:`, `grid_size:`: opforge.checks.base.SpecSection), by key, as each
    # check's reader built them; a section the spec does not give is absent.
    sections: tuple[tuple[str, Any], ...] = ()
    # Which special values special_values writes (SPECIAL_VALUES names); all of them by default.
    special_values: tuple[str, ...] = SPECIAL_VALUES
    # False for an op that synchronizes with the host (it cannot be captured in a CUDA graph): stream then checks
    # the side-stream order and skips the capture, saying why.
    cuda_graphs: bool = True
    # Seconds one check on one case may take before it is killed and reported TIMEOUT; None: the run's default.
    timeout: float | None = None
    # What `opforge bench` times; None when the spec has no `bench:` section.
    bench: BenchSpec | None = None
    # The dtypes claimed on each device where the spec gives them per device (`dtypes: {cpu: [...], cuda: [...]}`);
    # empty: `dtypes` holds on every device. `dtypes` is then the union, in the order first given.
    device_dtypes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Where each case's inputs come from when a function makes them; None: `inputs.<arg>.shapes`.
    samples: Samples | None = None
    regressions: tuple[Regression, ...] = ()
    # Line of each top-level key and of each input, for errors found after loading (schema mismatch, bad module).
    lines: tuple[tuple[str, int], ...] = field(default=(), compare=False)
    # What the loader read but would rather see written otherwise (an old key name), each with its file:line.
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        """The op's name with its overload (`leaky_swish.out`): what result ids and reports call it."""
        return self.op.split("::", 1)[1]

    @property
    def overload(self) -> str:
        """The overload the spec checks: `default` unless the op names one (`ns::name.out`)."""
        return self.name.split(".", 1)[1] if "." in self.name else "default"

    @property
    def python_modules(self) -> tuple[str, ...]:
        return self.load.python_modules

    @property
    def sources(self) -> tuple[Path, ...]:
        return self.load.sources

    @property
    def directory(self) -> Path:
        return self.path.parent

    def line_of(self, key: str) -> int | None:
        return dict(self.lines).get(key)

    def error(self, key: str, expected: str, got: str, hint: str) -> SpecError:
        return SpecError(self.path, self.line_of(key), key, expected, got, hint)

    def tensor_inputs(self) -> tuple[TensorInput, ...]:
        return tuple(i for i in self.inputs if isinstance(i, TensorInput))

    @property
    def shape_count(self) -> int:
        """How many shape pairings the spec lists (tensor inputs pair their shapes by position)."""
        tensors = self.tensor_inputs()
        return len(tensors[0].shapes) if tensors else 1

    def representative_shape_index(self) -> int:
        """The first shape pairing where every tensor is given, at least 1-D and non-empty (0-d and empty tensors
        say little about values), else the first: what the checks that run one case per device use."""
        tensors = self.tensor_inputs()
        for i in range(self.shape_count):
            if all(shape and all(shape) for shape in (t.shapes[i] for t in tensors)):
                return i
        return 0

    def section(self, key: str) -> Any:
        """The model of check-owned section `key` (opforge.checks.base.SpecSection), or None when the spec has none."""
        return dict(self.sections).get(key)

    def dtypes_on(self, device: str) -> tuple[str, ...]:
        """The dtypes the spec claims on `device`."""
        return dict(self.device_dtypes).get(device, self.dtypes) if self.device_dtypes else self.dtypes

    def xfail_for(
        self,
        implementation: str,
        check: str | None,
        dtype: str,
        device: str,
        layout: str,
        case_id: str,
        crashed: bool = False,
    ) -> XFail | None:
        """The entry declaring this result's failure: a crash entry for a result whose process died or hung
        (`crashed`), any other for a failure the check reported. `check` None: whatever check an entry names (fuzz
        runs every oracle of an example in one process, so a death there is no one check's)."""
        return next(
            (
                x
                for x in self.xfail
                if x.crash == crashed
                and x.matches(implementation, x.check if check is None else check, dtype, device, layout, case_id)
            ),
            None,
        )

    @property
    def bench_modes(self) -> tuple[str, ...]:
        """The modes `opforge bench` can time: a backward needs a differentiable op and an input that requires
        grad."""
        return bench_modes(self.differentiable, self.inputs)


def bench_modes(differentiable: bool, inputs: tuple[Input, ...]) -> tuple[str, ...]:
    has_gradients = any(isinstance(i, TensorInput) and i.requires_grad for i in inputs)
    return BENCH_MODES if differentiable and has_gradients else ("fwd",)
