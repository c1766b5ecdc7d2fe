"""The samples of a spec `opforge record` wrote: the op's recorded calls, read from its calls file.

    samples:
      function: opforge.recorded:samples
      file: mylib.scale_rows.calls.zip

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

# A calls file is a zip archive (stored, not compressed): INDEX, a JSON object {"format": CALLS_FORMAT, "op",
# "overload", "schema", "calls": N}, and call0.pt ... call{N-1}.pt, each a torch.save of one call's dict
# {"arguments": {name: encoded value}, ...} (opforge.tools.record.hook.encode; docs/record.md, "The calls file").
CALLS_FORMAT = "opforge-recorded-calls/1"
INDEX = "index.json"

_cache: dict[tuple[str, float], list[dict[str, Any]]] = {}


def read_calls(file: str | Path) -> list[dict[str, Any]]:
    """A calls file's calls, in order (cached while the file is unchanged)."""
    import io
    import json
    import zipfile

    import torch

    path = Path(file)
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _cache:
        with zipfile.ZipFile(path) as archive:
            index = json.loads(archive.read(INDEX))
            if not isinstance(index, dict) or index.get("format") != CALLS_FORMAT:
                raise ValueError(f"{path}: not a calls file of `opforge record` ({CALLS_FORMAT})")
            _cache[key] = [
                torch.load(io.BytesIO(archive.read(f"call{n}.pt")), weights_only=True) for n in range(index["calls"])
            ]
    return _cache[key]


def samples(*, dtype: Any, device: Any, generator: Any, file: str) -> Iterator[dict[str, Any]]:
    """One dict per recorded call (see the module's docstring)."""
    import torch

    for index, call in enumerate(read_calls(file)):
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
