"""The reference of a spec without `reference:`: the op itself, on contiguous copies of its inputs, in float64.

A spec that `opforge record` wrote, or one whose author has no independent reference yet, is still checked for
everything that does not need one: every other dtype, layout, storage offset, device, torch.compile, vmap and
determinism against the op's own result on the same values, contiguous and in the widest dtype. What it cannot
catch is an op that is wrong in that one call too (its own float64 contiguous result is the yardstick); what it
catches are the bugs that make one call differ from another: strides read as contiguous, a misaligned vector load,
a low-precision accumulator, a compiled graph built from a wrong fake.

The reference is called as any reference is: with the op's arguments, floating tensors in float64 on the CPU
(opforge.cases.arguments.CaseInputs.reference_args), integers (indices, lengths) in their own dtype. It calls the op on
contiguous copies of them (a storage offset of 0), on the CPU where the spec claims it (else on the spec's first
device), and returns what a reference returns: the outputs, then each mutated argument's new value. For the
low-precision baseline opforge calls the reference on the op's own dtypes
(checks.op_and_reference.reference_in_op_dtypes): then it is the op in the case's dtype on contiguous inputs.

float64 where the op takes it: a spec that claims float64 gets it. One that does not (a kernel with no float64
instantiation raises; some read any dtype's bytes as float32, fbgemm's FloatToFused8BitRowwiseQuantized) is called in
float64 and in its widest claimed dtype on each call, and the float64 result stands only where it agrees with that
one (the same NaNs and infinities, and a relative RMS difference within the square root of the claimed dtype's
unit roundoff: roundoff differences are far below it, bytes read as another dtype far above); else the claimed
dtype's result does, cast to float64.
A spec that claims no floating dtype at all (an op on integers, which the dtypes check tries in floating dtypes
too) gets float64, else the widest floating dtype the op runs in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opforge.cases.compare import leaves, map_tensors, returned_values

if TYPE_CHECKING:
    import torch
    from torch._ops import OpOverload

# Floating dtypes from the widest: the fallback is the first of these the spec claims.
WIDEST_FIRST = ("float64", "float32", "float16", "bfloat16")


@dataclass
class SelfReference:
    """The op itself as the reference (see the module's docstring). `overload` is the op; `claimed` the floating
    dtypes the spec claims on the device it runs on; `device` where it runs."""

    overload: OpOverload
    claimed: tuple[str, ...]
    device: str
    # The dtype its last call computed in (float64, the fallback for float64 inputs, or the op's own dtype where it
    # got no float64 input: an integer case, the low-precision baseline), and why float64 inputs were computed in
    # the fallback ("" when they were not): what a result says it was compared with, read right after the call.
    last_dtype: str = "float64"
    last_fallback_reason: str = ""
    # Whether the op is known to raise in float64 (it then is not called in float64 again).
    refuses_float64: bool = field(default=False)

    @property
    def fallback_dtype(self) -> str | None:
        """The widest floating dtype the spec claims other than float64; None when it claims none."""
        return next((d for d in WIDEST_FIRST[1:] if d in self.claimed), None)

    @property
    def label(self) -> str:
        """What a compared value was compared with, for messages: `the op itself on contiguous float64`."""
        where = "" if self.device == "cpu" else f" on {self.device}"
        why = f" ({self.last_fallback_reason})" if self.last_fallback_reason else ""
        return f"the op itself on contiguous {self.last_dtype}{where}{why}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        tensors = _tensors((args, kwargs))
        wide = any(t.dtype == torch.float64 for t in tensors)
        if not wide or "float64" in self.claimed:
            # The op's own dtypes (an integer case, the low-precision baseline), or float64 where it is claimed.
            floating = [t for t in tensors if t.is_floating_point() or t.is_complex()]
            if wide or not floating:
                # The call the values are compared with. One with narrow floating inputs only is the low-precision
                # baseline's, which a message names on its own: it leaves the label alone.
                shown = (floating or tensors)[0].dtype if tensors else None
                self.last_dtype = str(shown).removeprefix("torch.") if shown is not None else "inputs"
                self.last_fallback_reason = ""
            return self._call(args, kwargs, None)
        fallback = self.fallback_dtype
        if fallback is None:
            return self._first_that_runs(args, kwargs)
        narrow = self._call(args, kwargs, getattr(torch, fallback))
        reason = "it raises in float64"
        if not self.refuses_float64:
            try:
                widest = self._call(args, kwargs, None)
            except Exception:  # a kernel without float64: the claimed dtype it is
                self.refuses_float64 = True
            else:
                if _disagreement(widest, narrow, getattr(torch, fallback)) is None:
                    self.last_dtype, self.last_fallback_reason = "float64", ""
                    return widest
                reason = f"float64 is not claimed, and its float64 result is not its {fallback} one"
        self.last_dtype, self.last_fallback_reason = fallback, reason
        return narrow

    def _first_that_runs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A spec that claims no floating dtype (an op on integers, tried in a floating dtype by the dtypes check):
        float64, else the widest floating dtype the op runs in."""
        import torch

        error: Exception | None = None
        for dtype in WIDEST_FIRST:
            narrow = None if dtype == "float64" else getattr(torch, dtype)
            try:
                result = self._call(args, kwargs, narrow)
            except Exception as exc:  # that dtype has no kernel: the next one
                error = error or exc
                continue
            self.last_dtype = dtype
            self.last_fallback_reason = "" if dtype == "float64" else "it raises in float64"
            return result
        assert error is not None
        raise error

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any], narrow: torch.dtype | None) -> Any:
        """The op on contiguous copies of the arguments on self.device, float64 tensors cast to `narrow` when given;
        its floating results in `narrow` cast back to float64. Returns the outputs, then each mutated argument."""
        import torch

        def prepare(tensor: torch.Tensor) -> torch.Tensor:
            moved = tensor.to(self.device)
            if narrow is not None and moved.dtype == torch.float64:
                moved = moved.to(narrow)
            # A copy always (differentiable, so autograd reaches the caller's tensor): the op may write it.
            return moved.clone(memory_format=torch.contiguous_format)

        call_args = tuple(map_tensors(prepare, a) for a in args)
        call_kwargs = {k: map_tensors(prepare, v) for k, v in kwargs.items()}
        returned = self.overload(*call_args, **call_kwargs)
        schema = self.overload._schema
        outputs = returned_values(len(schema.returns), returned)
        names = [a.name for a in schema.arguments]
        mutated = []
        for argument in schema.arguments:
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            index = names.index(argument.name)
            mutated.append(call_args[index] if index < len(call_args) else call_kwargs[argument.name])
        values = tuple(_widened(v, narrow) for v in (*outputs, *mutated))
        return values[0] if len(values) == 1 else values

    def same_call(
        self, op_args: tuple[Any, ...], op_kwargs: dict[str, Any], ref_args: tuple[Any, ...], ref_kwargs: dict[str, Any]
    ) -> bool:
        """Whether the op's call with `op_args` was the very call its last reference call on `ref_args` made: every
        tensor of the same dtype (float64 ones in the dtype they were computed in), contiguous from the start of its
        storage, on the reference's device. Comparing such a call with its reference judges nothing."""
        import torch

        ops, refs = _tensors((op_args, op_kwargs)), _tensors((ref_args, ref_kwargs))
        if len(ops) != len(refs):
            return False
        for op, ref in zip(ops, refs):
            dtype = getattr(torch, self.last_dtype) if ref.dtype == torch.float64 else ref.dtype
            if op.dtype != dtype or op.device.type != self.device or not op.is_contiguous():
                return False
            if op.storage_offset() != 0:
                return False
        return True


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts, in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _widened(value: Any, narrow: torch.dtype | None) -> Any:
    """A result computed in the fallback dtype as float64 (the reference's convention); the rest as it is."""
    import torch

    return map_tensors(lambda t: t.to(torch.float64) if narrow is not None and t.dtype == narrow else t, value)


def _disagreement(wide: Any, narrow: Any, dtype: torch.dtype) -> str | None:
    """Why the op's float64 result is not its result in `dtype` (both as the reference returns them), or None when
    they agree: the same structure, shapes and non-finite elements, equal integers, and floating values within a
    relative RMS difference of sqrt(eps) of `dtype`."""
    import torch

    wides, narrows = [v for _, v in leaves("", wide)], [v for _, v in leaves("", narrow)]
    if len(wides) != len(narrows):
        return "a different number of results"
    allowed = math.sqrt(torch.finfo(dtype).eps)
    for index, (w, n) in enumerate(zip(wides, narrows)):
        if not isinstance(w, torch.Tensor) or not isinstance(n, torch.Tensor):
            if isinstance(w, torch.Tensor) or isinstance(n, torch.Tensor) or not _plain_close(w, n, allowed):
                return f"result {index}: {w!r} against {n!r}"
            continue
        if w.shape != n.shape:
            return f"result {index} of shape {tuple(w.shape)} against {tuple(n.shape)}"
        if not (w.is_floating_point() or w.is_complex()) or not (n.is_floating_point() or n.is_complex()):
            if not torch.equal(w.detach().cpu(), n.detach().to("cpu", w.dtype)):
                return f"result {index} holds other integers"
            continue
        a = w.detach().to("cpu", torch.float64)
        b = n.detach().to("cpu", torch.float64)
        finite = torch.isfinite(a) & torch.isfinite(b)
        same_specials = (torch.isnan(a) == torch.isnan(b)) & (torch.isinf(a) == torch.isinf(b))
        # A float64 value past the narrow dtype's range is its infinity there: the narrow result may overflow.
        overflows = torch.isfinite(a) & torch.isinf(b) & (a.abs() > torch.finfo(dtype).max)
        if not bool((same_specials | overflows).all()):
            return f"result {index} is NaN or infinite at other elements"
        both = finite & ~overflows
        if not bool(both.any()):
            continue
        error = (a[both] - b[both]).pow(2).mean().sqrt()
        scale = a[both].pow(2).mean().sqrt()
        if float(error) > allowed * float(scale) + torch.finfo(dtype).tiny:
            return f"result {index} off by a relative RMS difference of {float(error / scale):.3g}"
    return None


def _plain_close(a: Any, b: Any, allowed: float) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= allowed * abs(a) + 1e-12
    return bool(a == b)
