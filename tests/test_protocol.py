"""The one protocol of every child process (opforge.core.protocol): each child's job and events round-trip through
the one encoding, and what is not a message is said to be one, quoting it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest

from opforge.core.errors import WorkerInternalError
from opforge.core.protocol import (
    CaseRaised,
    CaseStarted,
    Died,
    Exited,
    Fork,
    FuzzExample,
    FuzzJob,
    Job,
    Judged,
    LargeIndexJob,
    LoadError,
    Message,
    Outcome,
    ProtocolError,
    Ready,
    Running,
    SanitizeJob,
    Space,
    Timed,
    decode,
    decode_stream,
    encode,
)
from opforge.core.results import Mismatch, Status, Verdict, describe_mismatch
from opforge.engine.plan import CheckJob, Filters, RunSettings

NAN_MISMATCH = Mismatch("out", (1, 2), math.nan, 1.0, math.inf, math.nan, math.inf, 0.5, 3, 10)

EVERY_CHILD = [
    # the engine's workers
    CheckJob("op.yaml", Filters(dtypes=("float32",), keyword="x"), RunSettings(seed=3, fail_fast=True), 2, 60.0),
    # fuzz's worker
    FuzzJob("op.yaml", "9.0"),
    FuzzExample({"shapes": [["x", [2, 3]]], "values": [], "dtype": "float32"}, ("correctness", "devices")),
    Space({"pairings": [[["x", [2, 3]]]], "special_inputs": ["x"], "sampled": False}),
    Ready(41),
    Timed("reference", 0.25),
    Judged(Verdict(Status.FAIL, "wrong", NAN_MISMATCH, oracle="correctness", cause="nan"), restart=True),
    Died("SIGSEGV (signal 11)"),
    LoadError("no such op", 2, died=True),
    # the checks' children
    LargeIndexJob("op.yaml", "native", 0, "float16", "cuda", (("x", (2**31 + 1,)),), (("alpha", 0.5),), 7, 5),
    Running(),
    Outcome(Verdict(Status.FAIL, "past 2^31", NAN_MISMATCH)),
    SanitizeJob("op.yaml", "native", 0, ({"id": "a", "shapes": [["x", [4]]]},), "9.0"),
    CaseStarted("x=4-float32", 120),
    CaseRaised("x=4-float32", "RuntimeError: bad", 240),
    # the fork server
    Fork("opforge.engine.worker", {"PATH": "/bin"}, None),
    Exited(41, -11),
]


@pytest.mark.parametrize("message", EVERY_CHILD, ids=lambda m: type(m).__name__)
def test_every_child_s_messages_round_trip_through_the_one_encoding(message):
    line = encode(message)
    assert line.endswith("\n") and line.count("\n") == 1
    again = decode(line.encode())
    assert type(again) is type(message)
    assert encode(again) == line  # NaN and inf compare unequal as floats: compare the lines
    if isinstance(message, Job):
        assert encode(type(message).from_line(line)) == line  # a job is read as its own class


def test_a_verdict_s_non_finite_floats_travel_as_strict_json_and_come_back():
    line = encode(Judged(Verdict(Status.FAIL, "m", NAN_MISMATCH)))
    assert "NaN" not in line and '"nan"' in line and '"inf"' in line
    back = decode(line)
    assert isinstance(back, Judged) and math.isnan(back.verdict.mismatch.got)
    assert back.verdict.mismatch.atol == math.inf and back.verdict.mismatch.index == (1, 2)


def test_a_complex_op_s_mismatch_comes_back_complex_not_as_its_text():
    # A complex output's worst element is a complex number, which the encoding writes as its str ("(1+2j)"): read
    # back it must be that number again, so an isolated run reports `got (1+2j)` as an in-process run does.
    mismatch = Mismatch("out", (0,), complex(1, 2), complex(math.nan, 0), 1.0, 2.0, 1e-5, 1e-6, 1, 4)
    back = decode(encode(Outcome(Verdict(Status.FAIL, "wrong", mismatch))))
    assert isinstance(back, Outcome) and back.verdict.mismatch is not None
    assert back.verdict.mismatch.got == complex(1, 2)
    assert isinstance(back.verdict.mismatch.expected, complex) and math.isnan(back.verdict.mismatch.expected.real)
    assert describe_mismatch(back.verdict.mismatch) == describe_mismatch(mismatch)


@pytest.mark.parametrize(
    "line, why",
    [
        ("not json at all", "JSONDecodeError"),
        ('{"event": "start", "index": 1}', "KeyError: 'kind'"),
        ('{"kind": "from-the-future"}', "KeyError: 'from-the-future'"),
        ("", "an empty line"),
    ],
)
def test_a_malformed_message_is_a_protocol_error_quoting_it(line, why):
    with pytest.raises(ProtocolError, match="a malformed message") as caught:
        decode(line)
    assert why in str(caught.value)
    assert isinstance(caught.value, WorkerInternalError)  # the run ends with the internal-error exit code
    if line:
        assert line[:40] in str(caught.value)


def test_a_job_read_where_another_message_came_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="expected a FuzzJob, got a Ready message"):
        FuzzJob.from_line(encode(Ready(3)))
    with pytest.raises(ProtocolError, match="expected a CheckJob, got a LargeIndexJob"):
        CheckJob.from_line(encode(EVERY_CHILD[9]))


def test_a_stream_cut_in_the_middle_of_a_message_keeps_what_came_before():
    said = (encode(Ready(1)) + encode(Timed("op", 0.5)) + encode(Died("x"))[:9]).encode()
    messages, cut = decode_stream(said)
    assert messages == [Ready(1), Timed("op", 0.5)] and cut == '{"kind": '
    assert decode_stream(encode(Ready(1)).encode()) == ([Ready(1)], "")


def test_two_messages_of_one_kind_are_refused():
    with pytest.raises(TypeError, match="two messages of kind 'ready'"):

        @dataclass(frozen=True)
        class Twin(Message):
            kind: ClassVar[str] = "ready"


def test_fuzz_s_parent_refuses_a_message_the_protocol_does_not_expect_there():
    from opforge.fuzz.process import FuzzWorker

    worker = FuzzWorker.__new__(FuzzWorker)  # no process: _expect only looks at the message
    assert worker._expect(Ready(5), Ready) == Ready(5)
    with pytest.raises(ProtocolError, match="the fuzz worker sent 'space' where 'ready' was expected"):
        worker._expect(Space({}), Ready)


def test_a_childs_stderr_is_read_from_its_last_bytes_only(tmp_path):
    # The large_index parent read the whole file: a child logging a line per element of a 2^31-element tensor would
    # have filled the parent's memory before the last lines (the CUDA error) were kept.
    from opforge.core.child import STDERR_KEPT_BYTES, file_tail

    with open(tmp_path / "stderr", "w+b") as file:
        file.write(b"noise\n" * 200_000 + b"CUDA error: an illegal memory access was encountered\n")
        file.seek(0)
        tail = file_tail(file)
        assert len(tail) <= STDERR_KEPT_BYTES and tail.endswith("an illegal memory access was encountered\n")
        assert file.tell() == 1_200_053  # left at the end, for the next read
