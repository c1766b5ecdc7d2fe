"""The C++/CUDA sources stay C++17: opforge supports torch >= 2.11, which builds extensions as C++17, while
every torch that runs here (2.13.0 CPU, 2.14.1+cu130 for the compile gate) builds them as C++20, so no compile in CI
would catch a C++20 construct. One did reach the H200 (std::countr_zero in column_sums.cuh, 2026-12-04) and cost a
device call."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from helpers import REPO

from opforge.tools.scaffold import scaffold

SOURCE_SUFFIXES = {".cpp", ".h", ".cu", ".cuh"}

# C++20-only headers, names and keywords a kernel author reaches for; each pattern with what to use in C++17.
CXX20_ONLY = [
    (
        re.compile(r"#\s*include\s*<(bit|span|ranges|concepts|numbers|format|compare|source_location|version)>"),
        "a C++20 header",
    ),
    (
        re.compile(
            r"\bstd::(countr_zero|countl_zero|countr_one|countl_one|popcount|bit_cast|bit_width|has_single_bit|"
            r"bit_ceil|bit_floor)\b"
        ),
        "a <bit> function (write a constexpr helper, or __builtin_ctz / __ffs in device code)",
    ),
    (re.compile(r"\bstd::(span|ranges|views|format|midpoint|lerp|ssize|to_address|numbers)\b"), "a C++20 library name"),
    (re.compile(r"\b(consteval|constinit|co_await|co_yield|co_return|char8_t)\b"), "a C++20 keyword"),
    (re.compile(r"\brequires\s*[({]|\bconcept\s+\w+\s*="), "a constraint (use std::enable_if_t or static_assert)"),
    (re.compile(r"<=>"), "the three-way comparison"),
    (re.compile(r"\[\[(likely|unlikely|no_unique_address)\]\]"), "a C++20 attribute"),
    (re.compile(r"\busing\s+enum\b"), "`using enum`"),
]


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) with comments and string literals blanked, so prose about C++20 does not count."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.DOTALL)
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
        lines.append((number, line.split("//", 1)[0]))
    return lines


def cxx20_uses(text: str) -> list[str]:
    return [
        f"line {number}: {what}: {match.group()!r}"
        for number, line in _code_lines(text)
        for pattern, what in CXX20_ONLY
        for match in [pattern.search(line)]
        if match
    ]


def _sources() -> dict[str, str]:
    """Every C++/CUDA source this repository builds: the bundled ops, the tests' ops, the benchmarks' kernels, and
    what `opforge new --stage cuda` writes for a user."""
    sources = {
        str(p.relative_to(REPO)): p.read_text()
        for folder in ("opforge/csrc", "tests/fixtures", "benchmarks")
        for p in sorted((REPO / folder).rglob("*"))
        if p.suffix in SOURCE_SUFFIXES
    }
    with tempfile.TemporaryDirectory() as directory:
        written = scaffold("scaffolded_op", Path(directory), "cuda", "myops").written
        sources.update({f"opforge new: {p.name}": p.read_text() for p in written if p.suffix in SOURCE_SUFFIXES})
    return sources


SOURCES = _sources()


def test_the_scan_sees_every_kind_of_source():
    names = set(SOURCES)
    expected = {
        "opforge/csrc/rms_norm.cpp",
        "opforge/csrc/cuda/column_sums.cuh",
        "tests/fixtures/real_ops/nms.cpp",
        "benchmarks/seed_kernel.cu",
        "opforge new: scaffolded_op.cpp",
        "opforge new: scaffolded_op.cu",
    }
    assert expected <= names, sorted(expected - names)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_source_is_cxx17(name):
    uses = cxx20_uses(SOURCES[name])
    assert not uses, (
        f"{name}: expected C++17 (torch 2.11 builds extensions as C++17), got "
        + "; ".join(uses)
        + ". Write it in C++17."
    )


@pytest.mark.parametrize(
    "code",
    [
        "#include <bit>",
        "constexpr int kBits = std::countr_zero(static_cast<unsigned>(kThreads));",
        "auto order = a <=> b;",
        "template <typename T> requires (sizeof(T) == 2) void f();",
        "if (x) [[likely]] { ++y; }",
        "consteval int f() { return 1; }",
        "std::span<const float> row(p, n);",
    ],
)
def test_a_cxx20_construct_is_found(code):
    assert cxx20_uses(f"// a comment\n{code}\n") != []


@pytest.mark.parametrize(
    "code",
    [
        "constexpr int log2_of_power_of_two(unsigned v) { return v <= 1 ? 0 : 1 + log2_of_power_of_two(v >> 1); }",
        "// std::countr_zero is C++20",
        "/* <=> and #include <bit>\n   std::span */ int x = 0;",
        'TORCH_CHECK(ok, "x <=> y: std::bit_cast");',
        "#include <bitset>",
        'static_assert(std::is_same_v<T, float>, "requires (float)");',
    ],
)
def test_cxx17_code_and_prose_pass(code):
    assert cxx20_uses(code) == []
