"""`opforge fuzz --save`: each failure's minimal example written into the spec's `regressions:` list, as text
appended to the author's file (their comments and layout stay), so `opforge check` runs it from then on."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from opforge.core.files import write_atomically
from opforge.spec.model import Regression

_SECTION = re.compile(r"^regressions:\s*(\[\s*\])?\s*(#.*)?$")
_TOP_LEVEL = re.compile(r"^[^\s#]")


def save_regressions(spec_path: Path, entries: list[dict[str, Any]], comment: str) -> int:
    """Append `entries` (regression mappings) under the spec's `regressions:` key, adding the key when missing.
    Returns how many were new: an entry equal to one the file already holds is left out."""
    text = spec_path.read_text(encoding="utf-8")
    existing = _existing(spec_path)
    fresh = [e for e in entries if e not in existing]
    if not fresh:
        return 0
    items = [f"  # {comment}"] + [f"  - {json.dumps(entry)}" for entry in fresh]
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _SECTION.match(line)), None)
    if start is None:
        header = "# Cases kept because they once broke the op (opforge fuzz --save); see docs/fuzz.md."
        lines += ["", header, "regressions:"]
        lines += items
    else:
        lines[start] = "regressions:"
        end = next((i for i in range(start + 1, len(lines)) if _TOP_LEVEL.match(lines[i])), len(lines))
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        lines[end:end] = items
    write_atomically(spec_path, "\n".join(lines) + "\n")
    return len(fresh)


def _existing(spec_path: Path) -> list[dict[str, Any]]:
    import yaml

    data = yaml.safe_load(spec_path.read_text(encoding="utf-8")) or {}
    kept = data.get("regressions") or []
    return [dict(entry) for entry in kept if isinstance(entry, dict)]


def example_json(example: Regression) -> dict[str, Any]:
    """An example as `--example` takes it and `regressions:` keeps it."""
    data: dict[str, Any] = {
        "dtype": example.dtype,
        "device": example.device,
        "layout": example.layout,
    }
    if example.sample is not None:
        data["sample"] = example.sample
    else:
        data["shapes"] = {name: list(shape) for name, shape in example.shapes}
    if example.values:
        data["values"] = dict(example.values)
    if example.fill:
        data["fill"] = example.fill
    data["seed"] = example.seed
    return data


def repro_command(spec_path: Path, example: Regression) -> str:
    return shlex.join(["opforge", "fuzz", str(spec_path), "--example", json.dumps(example_json(example))])
