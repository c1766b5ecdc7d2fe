"""The JSON formats: `opforge check --json` (every result with its worst mismatch, seed and rerun command; versioned
by results.JSON_SCHEMA_VERSION) and `opforge bench --json` (every timing with its raw samples and the environment,
what `--baseline` gates against). Strict JSON: non-finite floats are written as strings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opforge.core.files import write_atomically
from opforge.core.results import dumps_json
from opforge.reporters.base import Reporter


class JsonReport(Reporter):
    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: Any) -> None:
        write_atomically(self.path, dumps_json(run.to_json()))


class BenchJsonReport(Reporter):
    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: Any) -> None:
        write_atomically(self.path, dumps_json(run.to_json(), indent=1))
