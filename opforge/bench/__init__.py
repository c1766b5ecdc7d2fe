"""opforge bench: time an op's implementations against its reference and torch.compile of it.

Modules: `plan` (the points: sizes, dtypes, modes, layouts), `bytes` (the bytes a point moves, from the spec's
`bench.bytes`), `stats` (medians, IQR, the ratio confidence interval), `timing` (CUDA-event and
torch.utils.benchmark timers), `peak` (measured copy bandwidth, cached), `runner` (verification, timing, results),
`environment`, `baseline` (the regression gate), `trailing` (points slower than a baseline of the same run, and
their gate), `model` (a run's results and their JSON). Its reports are the
reporters' (bench_terminal, json_report, junit, csv_report, plot). Importing this package does not import torch.
"""
