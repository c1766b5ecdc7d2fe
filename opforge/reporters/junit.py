"""The JUnit XML format of `opforge check`, `opforge fuzz` and `opforge bench`: a testsuite per op, a testcase
per result (FAIL and XPASS as failures; ERROR, CRASH and TIMEOUT as errors; SKIP and XFAIL as skipped), each
failure's full account as its text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opforge.core.files import write_atomically
from opforge.core.results import RunReport, Status, failure_text
from opforge.reporters.base import Reporter, as_results


class JunitReport(Reporter):
    def __init__(self, path: Path):
        self.path = path

    def finish(self, run: Any) -> None:
        write_junit(as_results(run), self.path)


def write_junit(report: RunReport, path: Path) -> None:
    from xml.etree import ElementTree as ET

    suites = ET.Element("testsuites", name="opforge", time=f"{report.seconds:.3f}")
    for op in report.ops:
        counts = op.counts()
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=op.op,
            tests=str(len(op.results)),
            failures=str(counts["fail"] + counts["xpass"]),
            errors=str(sum(counts[s.value] for s in Status if s.unfinished)),
            skipped=str(counts["skip"] + counts["xfail"]),
            time=f"{op.seconds:.3f}",
        )
        for r in op.results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{op.op}.{r.implementation}.{r.check}",
                name=r.case_id,
                time=f"{r.seconds:.3f}",
            )
            detail = failure_text(r)
            if r.status in (Status.FAIL, Status.XPASS):
                ET.SubElement(
                    case, "failure", message=r.message.splitlines()[0] if r.message else r.status.value
                ).text = detail
            elif r.status.unfinished:
                ET.SubElement(
                    case, "error", message=r.message.splitlines()[0] if r.message else r.status.value
                ).text = detail
            elif r.status in (Status.SKIP, Status.XFAIL):
                ET.SubElement(case, "skipped", message=r.message)
    ET.indent(suites)
    write_atomically(path, ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n")
