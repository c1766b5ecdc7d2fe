"""The samples of a spec `opforge record` wrote: the op's recorded calls, read from its calls file.

    samples:
      function: opforge.recorded:samples
      file: mylib.scale_rows.calls.pt

One sample per recorded call (named `call0`, `call1`, ...), each argument as the program passed it: a floating
tensor with its recorded values in the case's dtype on the case's device (contiguous: the matrix makes the other
layouts), an integer or bool tensor (an index, lengths) with its own dtype and values, a list of tensors likewise,
every other argument as it was. A tensor recorded by its summary alone (past the size cap, docs/record.md) gets
values drawn from a generator of the sample's own: uniform within its recorded range (integers too, sorted where
the recorded ones were), so every case of the sample sees the same values.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The format of a calls file: a dict {"format": CALLS_FORMAT, "op", "overload", "schema", "calls": [call, ...]},
# each call {"arguments": {name: encoded value}, "argv": [...]} (opforge.record.hook.encode).
CALLS_FORMAT = "opforge-recorded-calls/1"

_cache: dict[tuple[str, float], dict[str, Any]] = {}


def read_calls(file: str | Path) -> dict[str, Any]:
    """A calls file's content (cached while the file is unchanged)."""
    import torch

    path = Path(file)
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _cache:
        content = torch.load(path, weights_only=True)
        if not isinstance(content, dict) or content.get("format") != CALLS_FORMAT:
            raise ValueError(f"{path}: not a calls file of `opforge record` ({CALLS_FORMAT})")
        _cache[key] = content
    return _cache[key]


def samples(*, dtype: Any, device: Any, generator: Any, file: str) -> Iterator[dict[str, Any]]:
    """One dict per recorded call (see the module's docstring)."""
    import torch

    for index, call in enumerate(read_calls(file)["calls"]):
        own = torch.Generator().manual_seed(index)
        sample = {name: decode(value, dtype, device, own) for name, value in call["arguments"].items()}
        sample["_name"] = f"call{index}"
        yield sample


def decode(value: Any, dtype: Any, device: Any, generator: Any) -> Any:
    """An encoded argument as the op takes it in a case of `dtype` on `device`."""
    import torch

    if not isinstance(value, dict):
        return value
    kind = value.get("kind")
    if kind == "list":
        return [decode(item, dtype, device, generator) for item in value["items"]]
    if kind == "dtype":
        return getattr(torch, value["name"])
    if kind == "device":
        return torch.device(value["name"])
    if kind == "tensor":
        recorded = getattr(torch, value["dtype"])
        tensor = value["values"]
        if tensor is None:
            tensor = synthesized(value, recorded, generator)
        floating = recorded.is_floating_point or recorded.is_complex
        return tensor.to(dtype=dtype if floating else recorded, device=device).reshape(value["shape"])
    raise ValueError(f"a recorded value opforge cannot give back: {value.get('name', value)!r}")


def synthesized(value: dict[str, Any], dtype: Any, generator: Any) -> Any:
    """Values for a tensor recorded by its summary: uniform in its recorded [min, max], integers too (sorted where
    the recorded ones were); NaN and infinities as many as it had, at the start."""
    import math

    import torch

    summary = value["summary"]
    numel = math.prod(value["shape"])
    low, high = summary["min"], summary["max"]
    if dtype.is_floating_point or dtype.is_complex:
        flat = torch.rand(numel, generator=generator, dtype=torch.float64) * (high - low) + low
        specials = [math.nan] * summary["nan"] + [math.inf] * summary["posinf"] + [-math.inf] * summary["neginf"]
        if specials:
            flat[: len(specials)] = torch.tensor(specials[:numel], dtype=torch.float64)
    elif dtype == torch.bool:
        flat = torch.randint(0, 2, (numel,), generator=generator).to(torch.float64)
    else:
        flat = torch.randint(int(low), int(high) + 1, (numel,), generator=generator).to(torch.float64)
    if summary["sorted"]:
        flat = flat.sort().values
    return flat.to(dtype)
