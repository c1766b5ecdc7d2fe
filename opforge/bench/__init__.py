"""opforge bench: time an op's implementations against its reference and torch.compile of it.

Modules: `expr` (the spec's bytes-moved expression, no torch), `stats` (medians, IQR, the ratio confidence
interval), `timing` (CUDA-event and torch.utils.benchmark timers), `peak` (measured copy bandwidth, cached),
`runner` (cases, verification, timing), `environment`, `baseline` (the regression gate), `export` (JSON, CSV,
plot). Importing this package does not import torch.
"""
