"""The spec's `xfail:` list: known failures, by check (or one of its result names), implementation, dtype, device,
layout and case id (a glob); `crash: true` for a known crash or hang."""

from __future__ import annotations

from opforge.checks.catalog import CATALOG
from opforge.spec.model import KNOWN_DEVICES, KNOWN_DTYPES, XFAIL_LAYOUTS, XFail
from opforge.spec.reader import (
    Node,
    Reader,
    check_implementation_names,
    list_of,
    one_of,
    read_bool,
    read_str,
    suggest,
)


def read_xfails(r: Reader, implementations: tuple[tuple[str, str], ...]) -> tuple[XFail, ...]:
    xfails: tuple[XFail, ...] = r.get("xfail", list_of(_read_xfail, allow_empty=True), ())
    check_implementation_names(r, "xfail", tuple(x.implementation for x in xfails), implementations)
    return xfails


def _read_xfail(r: Reader, key: str, node: Node) -> XFail:
    x = Reader(
        r.path,
        node,
        key,
        ("check", "implementation", "dtype", "device", "layout", "case", "reason", "strict", "crash"),
        required=("check", "reason"),
    )
    check = x.get("check", read_str)
    if check not in CATALOG.names and check not in CATALOG.result_names:
        raise x.fail(
            x.child("check"),
            f"{key}.check",
            f"one of {', '.join(CATALOG.names)} (or one of a check's result names: {', '.join(CATALOG.sub_results)})",
            repr(check),
            suggest(check, CATALOG.names + CATALOG.sub_results),
        )
    return XFail(
        check=check,
        reason=x.get("reason", read_str),
        implementation=x.get("implementation", read_str),
        dtype=x.get("dtype", one_of(KNOWN_DTYPES)),
        device=x.get("device", one_of(KNOWN_DEVICES)),
        layout=x.get("layout", one_of(XFAIL_LAYOUTS)),
        case=x.get("case", read_str),
        strict=x.get("strict", read_bool, True),
        crash=x.get("crash", read_bool, False),
    )
