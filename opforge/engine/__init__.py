"""Running checks: `plan` (which tasks an op runs under the filters), `tasks` (one task: a check on a case, its outcomes
as results; the one loop every runner uses), `inprocess` (this process), `isolated` (one worker process per op, so a
crash or hang costs one task: its `worker`, speaking `opforge.core.protocol`, forked from a `forkserver`), the checks'
own children (`large_index_child`, `sanitize_child`), `events` (every event a run reports, declared once). The parent
of an isolated run never imports torch.
"""
