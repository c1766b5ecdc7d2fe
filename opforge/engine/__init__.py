"""Running checks: `plan` (which rows an op runs under the filters), `rows` (one row: a check on a case, its outcomes
as results; the one loop every runner uses), `inprocess` (this process), `isolated` (one worker process per op, so a
crash or hang costs one row) with its `worker` and the typed `protocol` between them, `events` (what a run reports as
it goes). The parent of an isolated run never imports torch.
"""
