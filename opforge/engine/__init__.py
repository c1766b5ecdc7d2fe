"""Running checks: `plan` (which tasks an op runs under the filters), `tasks` (one task: a check on a case, its outcomes
as results; the one loop every runner uses), `inprocess` (this process), `isolated` (one worker process per op, so a
crash or hang costs one task) with its `worker` and the typed `protocol` between them, `events` (what a run reports as
it goes). The parent of an isolated run never imports torch.
"""
