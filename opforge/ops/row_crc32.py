"""row_crc32(data) and row_adler32(data): zlib's checksum of each row (the last dimension) of a uint8 tensor.

The seed article's op that wraps an external library (section 7.2): the C++ kernel (opforge/csrc/row_crc32.cpp) calls
zlib and is linked with -lz. zlib's header comes from the system (Debian: zlib1g-dev). The checksums are not
differentiable: the fakes below are all autograd needs to know.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
from torch import Tensor

from opforge.ops import load_native

# A spec that builds these sources itself (specs/row_crc32.yaml, load.libraries) must name the same libraries.
LIBRARIES = ("z",)

load_native("row_crc32", libraries=LIBRARIES)

# The native ops, typed by their schemas.
_crc32: Callable[[Tensor], Tensor] = torch.ops.opforge.row_crc32.default
_adler32: Callable[[Tensor], Tensor] = torch.ops.opforge.row_adler32.default


def row_crc32(data: Tensor) -> Tensor:
    """CRC-32 (zlib.crc32) of each row of a uint8 tensor, as int64 of shape data.shape[:-1]."""
    return _crc32(data)


def row_adler32(data: Tensor) -> Tensor:
    """Adler-32 (zlib.adler32) of each row of a uint8 tensor, as int64 of shape data.shape[:-1]."""
    return _adler32(data)


def _rows_checksum(data: Tensor, checksum: Callable[[bytes], int]) -> Tensor:
    # The bytes are the values: opforge's dtypes check hands the reference byte values held in float64. The row
    # count is spelled out: reshape(-1, 0) of rows of length 0 is ambiguous.
    as_bytes = data.detach().cpu().to(torch.uint8).contiguous()
    rows = as_bytes.reshape(math.prod(data.shape[:-1]), data.shape[-1]).numpy()
    values = [checksum(row.tobytes()) for row in rows]
    return torch.tensor(values, dtype=torch.int64).reshape(data.shape[:-1])


def reference(data: Tensor) -> Tensor:
    """Python's own zlib.crc32, row by row."""
    return _rows_checksum(data, zlib.crc32)


def reference_adler32(data: Tensor) -> Tensor:
    return _rows_checksum(data, zlib.adler32)


def _checksum_fake(data: Tensor) -> Tensor:
    torch._check(data.dtype == torch.uint8, lambda: f"data must be uint8 (the bytes to checksum), got {data.dtype}")
    torch._check(data.dim() >= 1, lambda: "data must have at least 1 dimension (rows are all but the last)")
    return data.new_empty(data.shape[:-1], dtype=torch.int64)


torch.library.register_fake("opforge::row_crc32")(_checksum_fake)
torch.library.register_fake("opforge::row_adler32")(_checksum_fake)
