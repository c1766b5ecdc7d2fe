"""Sanity check of int64 indexing on a GPU: a tensor past 2^31 elements, compared with the reference at its end.

Run: python benchmarks/large_index.py   (needs ~17 GB of GPU memory)
"""

import torch

from opforge.ops.custom_loss import custom_loss
from opforge.ops.custom_loss import reference as loss_reference
from opforge.ops.leaky_swish import leaky_swish, reference

N = 2**31 + 4099  # past int32's range, and not a multiple of any vector width
TAIL = 2**20

x = torch.randn(N, device="cuda", dtype=torch.float16)
y = leaky_swish(x)
tail = slice(N - TAIL, N)
print(
    "leaky_swish float16 n=2^31+4099: max abs error over the last 2^20 elements:",
    (y[tail].double() - reference(x[tail].double(), 0.1)).abs().max().item(),
)
del y
t = torch.randn(N, device="cuda", dtype=torch.float16)
loss = custom_loss(x, t)
print(
    "custom_loss float16 n=2^31+4099: max abs error over the last 2^20 elements:",
    (loss[tail].double() - loss_reference(x[tail].double(), t[tail].double())).abs().max().item(),
)
