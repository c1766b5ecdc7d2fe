"""The events of a run, declared once (opforge.engine.events): every subscriber (the reporters, bench's progress,
fuzz's live line) takes its hooks from that one declaration."""

from __future__ import annotations

import pytest

from opforge.engine.events import HOOKS, Events, FanOut


def test_the_one_declaration_names_every_event_a_run_reports():
    assert HOOKS == ("start", "step", "task_started", "task_finished", "planned", "result", "progress", "finish")


def test_every_subscriber_hears_the_one_declaration():
    from opforge.reporters.base import Reporter
    from opforge.reporters.bench_terminal import BenchProgress
    from opforge.reporters.fuzz_report import Live
    from opforge.reporters.terminal import TerminalReport

    for subscriber in (Reporter, TerminalReport, BenchProgress, Live):
        assert issubclass(subscriber, Events), subscriber
        # What it overrides is declared there, with the declaration's arguments.
        for name in set(vars(subscriber)) & set(HOOKS):
            declared = getattr(Events, name).__code__
            assert getattr(subscriber, name).__code__.co_argcount == declared.co_argcount, (subscriber, name)


def test_a_hook_given_by_name_must_be_one_the_declaration_has():
    heard = []
    events = Events(result=lambda op, result: heard.append((op, result)))
    events.result("op", 1)
    events.step("ignored")
    assert heard == [("op", 1)]
    with pytest.raises(TypeError, match="no event 'reslt': a run reports start, step, "):
        Events(reslt=print)


def test_a_fan_out_delivers_every_event_to_each_subscriber_in_order():
    heard = []
    subscribers = [
        Events(**{name: (lambda *a, n=name, i=i: heard.append((i, n, a))) for name in HOOKS}) for i in (0, 1)
    ]
    fan = FanOut(subscribers)
    fan.start()
    fan.planned("op", 3)
    fan.progress("report", 1.5)
    fan.finish("run")
    assert heard == [
        (0, "start", ()),
        (1, "start", ()),
        (0, "planned", ("op", 3)),
        (1, "planned", ("op", 3)),
        (0, "progress", ("report", 1.5)),
        (1, "progress", ("report", 1.5)),
        (0, "finish", ("run",)),
        (1, "finish", ("run",)),
    ]
