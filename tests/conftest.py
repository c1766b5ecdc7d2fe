from __future__ import annotations

import os
from pathlib import Path

import pytest

# pytest-xdist runs one worker per core (pyproject's `-n auto`); each worker's torch, and the fork servers, workers
# and subprocesses it starts, get the cores divided by the workers as intra-op threads, as opforge's own -j gives its
# workers (engine.isolated.threads_per_worker). With torch's default of every core per worker, OpenMP's threads
# oversubscribe the cores and spin: on the 2-core VM the suite took 277 s of CPU and 153 s, and 240 s and 134 s
# with one thread per worker (docs/performance.md). Set before torch is imported: OpenMP reads it once, then.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

# opforge's consoles take their width when opforge.reporters.console is first imported: from COLUMNS when it is set,
# else 140 columns when stdout is no terminal. pytest-xdist's workers set COLUMNS=80, which wraps the tables the CLI
# tests read; one width for every run, serial or not, set before any test module imports the CLI.
os.environ["COLUMNS"] = "250"

from helpers import FIXTURES


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    """`opforge check` records failures under the directory it runs in (.opforge/lastfailed.json): a test run must
    not write the checkout's record, nor read what an earlier test left there."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES
