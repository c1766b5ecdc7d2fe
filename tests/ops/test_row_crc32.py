"""opforge::row_crc32 and row_adler32: zlib's checksums per row, linked through load_native(libraries=...)."""

from __future__ import annotations

import zlib

import pytest
import torch
from helpers import requires_cuda

from opforge.building.extension import detect_toolchain, plan_build
from opforge.ops import native_sources
from opforge.ops.row_crc32 import LIBRARIES, reference, reference_adler32, row_adler32, row_crc32

# 1-D (one row: a 0-d result), one byte, no multiple of any vector width, 2-D odd, N-D, no rows, empty rows.
SHAPES = [(7,), (1,), (33, 65), (2, 3, 17), (0, 5), (4, 0), (2, 0, 3)]
CHECKSUMS = [(row_crc32, reference), (row_adler32, reference_adler32)]
CHECKSUM_IDS = ["crc32", "adler32"]


def random_bytes(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8)


def assert_checksums(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.dtype == torch.int64 and got.device == expected.device
    # Exact: a checksum has no tolerance. assert_close names the worst element when it fails.
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@pytest.mark.parametrize("op, ref", CHECKSUMS, ids=CHECKSUM_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_pythons_zlib(shape, op, ref):
    data = random_bytes(*shape)
    got = op(data)
    assert got.shape == data.shape[:-1]
    assert_checksums(got, ref(data))


def test_known_values():
    data = torch.tensor([list(b"hello world"), list(b"HELLO WORLD")], dtype=torch.uint8)
    assert row_crc32(data).tolist() == [zlib.crc32(b"hello world"), zlib.crc32(b"HELLO WORLD")]
    assert row_crc32(data)[0] == 0x0D4A1185  # the published CRC-32 of "hello world"
    # Empty rows: zlib's initial values.
    assert row_crc32(torch.empty(2, 0, dtype=torch.uint8)).tolist() == [0, 0]
    assert row_adler32(torch.empty(2, 0, dtype=torch.uint8)).tolist() == [1, 1]


@pytest.mark.parametrize("op, ref", CHECKSUMS, ids=CHECKSUM_IDS)
@pytest.mark.parametrize(
    "make",
    [
        lambda: random_bytes(65, 33).t(),  # strided rows: copied
        lambda: random_bytes(33, 130)[:, ::2],  # strided rows with gaps
        lambda: random_bytes(66, 65)[::2],  # dense rows, strided leading dimension: walked, not copied
        lambda: random_bytes(3, 4, 17).permute(1, 0, 2),  # permuted leading dimensions
        lambda: random_bytes(1, 17).expand(5, 17),  # the same row five times (stride 0)
        lambda: random_bytes(2, 3, 5, 4).to(memory_format=torch.channels_last),
    ],
    ids=["transposed", "strided", "sliced_rows", "permuted", "expanded", "channels_last"],
)
def test_non_contiguous_inputs(make, op, ref):
    data = make()
    assert not data.is_contiguous()
    assert_checksums(op(data), ref(data))


def test_results_do_not_depend_on_thread_count():
    data = random_bytes(4099, 257)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = row_crc32(data)
        torch.set_num_threads(max(2, threads))
        many = row_crc32(data)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)
    assert_checksums(many, reference(data))


@pytest.mark.parametrize("op", [row_crc32, row_adler32], ids=CHECKSUM_IDS)
def test_rejects_other_dtypes_with_a_clear_message(op):
    with pytest.raises(RuntimeError, match=r"data must be uint8 .*, got Float\. View other data as bytes first"):
        op(torch.ones(3, 4))
    with pytest.raises(RuntimeError, match=r"data must be uint8 .*, got Char"):
        op(torch.ones(3, 4, dtype=torch.int8))


@pytest.mark.parametrize("op", [row_crc32, row_adler32], ids=CHECKSUM_IDS)
def test_rejects_a_0d_tensor_with_a_clear_message(op):
    with pytest.raises(RuntimeError, match=r"data must have at least 1 dimension .*got a 0-d tensor"):
        op(torch.tensor(7, dtype=torch.uint8))


@requires_cuda
def test_has_no_cuda_kernel():
    # CPU only: the dispatcher refuses a CUDA tensor, naming the op and the backend.
    with pytest.raises(NotImplementedError, match=r"row_crc32.*CUDA"):
        row_crc32(random_bytes(3).cuda())


@pytest.mark.parametrize(
    "op", [torch.ops.opforge.row_crc32.default, torch.ops.opforge.row_adler32.default], ids=CHECKSUM_IDS
)
def test_registration_passes_opcheck(op):
    for shape in [(33, 65), (2, 3, 17), (4, 0)]:
        torch.library.opcheck(op, (random_bytes(*shape),))


def test_output_is_not_differentiable():
    data = random_bytes(3, 4)
    assert not row_crc32(data).requires_grad


def test_link_options_are_part_of_the_build_identity():
    toolchain = detect_toolchain()
    sources = native_sources("row_crc32")
    linked = plan_build(sources, toolchain, libraries=LIBRARIES)
    assert linked == plan_build(sources, toolchain, libraries=LIBRARIES)
    assert "-lz" in linked.link_libraries
    others = [
        plan_build(sources, toolchain),
        plan_build(sources, toolchain, libraries=("m",)),
        plan_build(sources, toolchain, libraries=LIBRARIES, include_dirs=("/usr/include",)),
        plan_build(sources, toolchain, libraries=LIBRARIES, extra_cflags=("-DZLIB_CONST",)),
    ]
    assert len({linked.directory, *(p.directory for p in others)}) == 1 + len(others)
    # A library file's path is linked as such.
    assert plan_build(sources, toolchain, libraries=("/usr/lib/libfoo.so",)).link_libraries == ("/usr/lib/libfoo.so",)


@pytest.mark.parametrize("library", ["", "-lz"])
def test_a_library_must_be_a_name_or_a_file(library):
    with pytest.raises(ValueError, match="expected a library name such as `z`"):
        plan_build(native_sources("row_crc32"), detect_toolchain(), libraries=(library,))


def test_reference_takes_byte_values_in_any_dtype():
    # opforge's dtypes check hands the reference the case's byte values held in float64.
    data = random_bytes(5, 9)
    assert_checksums(reference(data.double()), row_crc32(data))
    assert_checksums(reference_adler32(data.double()), row_adler32(data))
