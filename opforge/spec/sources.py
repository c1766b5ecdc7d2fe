"""The spec's `load:` section: how the op gets registered. Python modules to import, C++/CUDA sources to build with
what they need (header directories, libraries, flags), an import root for a package the spec checks, and the
extension module a package expects its sources to be built as."""

from __future__ import annotations

import os
import re
from pathlib import Path

from opforge.spec.model import Load
from opforge.spec.reader import Node, Reader, describe, list_of, read_str

LOAD_KEYS = ("python", "sources", "include_dirs", "libraries", "extra_cflags", "path", "module")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# What a library entry may be: a name for -l<name> (z, ssl, stdc++fs) or a path to a library file.
_LIBRARY_NAME = re.compile(r"^[A-Za-z0-9_+.-]+$")
# The environment-variable references os.path.expandvars replaces: $NAME and ${NAME} (its own pattern).
_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)


def read_load_section(r: Reader, spec_path: Path) -> Load:
    node = r.child("load")
    load = Reader(spec_path, node, "load", LOAD_KEYS)
    python_modules = load.get("python", list_of(read_str, allow_empty=True), ())
    sources = _sources(load, spec_path) if load.has("sources") else ()
    if not python_modules and not sources:
        raise r.fail(
            node,
            "load",
            "`python:` modules or `sources:` files that register the op",
            "neither",
            "List the module that defines the op or its C++ sources.",
        )
    module = load.get("module", read_str)
    if module is not None and not _MODULE.match(module):
        raise load.fail(
            load.child("module"),
            "load.module",
            "a dotted module name such as `mypkg._C`",
            repr(module),
            "Name the module the package imports its compiled ops from.",
        )
    if module is not None and not sources:
        raise load.fail(
            load.child("module"),
            "load.module",
            "`load.sources` that build it",
            "no sources",
            "List the package's C++/CUDA sources under load.sources, or drop load.module.",
        )
    return Load(
        python_modules=python_modules,
        sources=sources,
        include_dirs=tuple(_directory(load, spec_path, "include_dirs", i, n) for i, n in _items(load, "include_dirs")),
        libraries=tuple(_library(load, spec_path, i, n) for i, n in _items(load, "libraries")),
        extra_cflags=load.get("extra_cflags", list_of(read_str), ()),
        path=tuple(_directory(load, spec_path, "path", i, n) for i, n in _items(load, "path")),
        module=module,
    )


def _items(load: Reader, key: str) -> list[tuple[int, Node]]:
    if not load.has(key):
        return []
    node = load.child(key)
    if not isinstance(node.value, list) or not node.value:
        raise load.fail(node, f"load.{key}", "a non-empty list", describe(node.value), "Write a YAML list: [a, b].")
    return list(enumerate(node.value))


def _path_text(load: Reader, key: str, item: Node) -> str:
    """A path as the spec writes it, its environment variables expanded. os.path.expandvars leaves an unset one as it
    is, which would become a path that names `${VAR}` literally: that is an error at the spec's line instead."""
    text = read_str(load, key, item)
    for reference in _VARIABLE.finditer(text):
        name = reference.group(1).removeprefix("{").removesuffix("}")
        if name not in os.environ:
            raise load.fail(
                item,
                key,
                f"the environment variable {name} to be set ({text!r} uses it)",
                f"{name} unset",
                f"Set {name} before running opforge, or write the path without it (relative to the spec, or absolute).",
            )
    return os.path.expandvars(text)


def _directory(load: Reader, spec_path: Path, key: str, index: int, item: Node) -> Path:
    rel = _path_text(load, f"load.{key}[{index}]", item)
    directory = (spec_path.parent / rel).resolve()
    if not directory.is_dir():
        raise load.fail(
            item,
            f"load.{key}[{index}]",
            "an existing directory (relative to the spec, or absolute)",
            f"{directory} is missing",
            "Fix the path; a relative one is resolved against the spec's directory.",
        )
    return directory


def _library(load: Reader, spec_path: Path, index: int, item: Node) -> str:
    """A library name (linked as -l<name>, found on the linker's path) or a library file (relative to the spec, or
    absolute)."""
    text = _path_text(load, f"load.libraries[{index}]", item)
    if "/" in text or text.endswith((".so", ".a")) or ".so." in text:
        library = (spec_path.parent / text).resolve()
        if not library.is_file():
            raise load.fail(
                item,
                f"load.libraries[{index}]",
                "a library name such as `z` (linked as -lz) or an existing library file (relative to the spec, or "
                "absolute)",
                f"{library} is missing",
                "Fix the path, or give the library's name for the linker to find.",
            )
        return str(library)
    if not _LIBRARY_NAME.match(text) or text.startswith("-"):
        raise load.fail(
            item,
            f"load.libraries[{index}]",
            "a library name such as `z` (linked as -lz) or a library file",
            repr(text),
            "Write the name without -l, e.g. `z` for zlib.",
        )
    return text


def _sources(load: Reader, spec_path: Path) -> tuple[Path, ...]:
    node = load.child("sources")
    if not isinstance(node.value, list):
        raise load.fail(
            node,
            "load.sources",
            "a list of C++/CUDA files",
            describe(node.value),
            "List the files, relative to the spec or absolute.",
        )
    return tuple(_source_path(load, spec_path, i, item) for i, item in enumerate(node.value))


def _source_path(load: Reader, spec_path: Path, index: int, item: Node) -> Path:
    rel = _path_text(load, f"load.sources[{index}]", item)
    source = (spec_path.parent / rel).resolve()
    if source.suffix not in (".cpp", ".cc", ".cu"):
        raise load.fail(
            item,
            f"load.sources[{index}]",
            "a .cpp, .cc or .cu file",
            repr(rel),
            "List translation units only; headers are found next to them.",
        )
    if not source.is_file():
        raise load.fail(
            item,
            f"load.sources[{index}]",
            "an existing file (relative to the spec, or absolute)",
            f"{source} is missing",
            "Fix the path; a relative one is resolved against the spec's directory.",
        )
    return source
