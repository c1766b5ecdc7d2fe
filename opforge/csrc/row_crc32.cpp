// opforge::row_crc32(data) and opforge::row_adler32(data): zlib's checksum of each row (the last dimension) of a
// uint8 tensor, as int64. The seed article's "wrap an external library" example: the kernel is zlib's, linked with
// -lz (opforge/ops/row_crc32.py passes `libraries=("z",)` to the build; the header comes from zlib1g-dev).
// Rows are split across threads, each row checksummed by zlib in one call (or in 4 GiB chunks). Memory traffic:
// each byte read once, 8 bytes written per row.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

namespace opforge::cpu {
namespace {

// zlib's crc32 and adler32 share this signature and are updated chunk by chunk the same way.
using Checksum = uLong (*)(uLong, const Bytef*, uInt);

// zlib takes a row's length as uInt (32 bits): a longer row goes in chunks of at most this many bytes.
constexpr int64_t kMaxChunk = UINT_MAX;
// Bytes per parallel task below which at::parallel_for stays on one thread: ATen's elementwise grain
// (at::internal::GRAIN_SIZE); zlib checksums so few cycles per byte that a smaller task is not worth a thread.
constexpr int64_t kGrainBytes = 32768;

void check_data(const at::Tensor& data, const char* op) {
  TORCH_CHECK(data.scalar_type() == at::kByte, op, ": data must be uint8 (the bytes to checksum), got ",
              data.scalar_type(), ". View other data as bytes first, e.g. data.view(torch.uint8).");
  TORCH_CHECK(data.dim() >= 1, op, ": data must have at least 1 dimension (rows are all but the last), got a 0-d "
              "tensor. Give a scalar byte as a 1-element row, e.g. data.reshape(1).");
}

// Byte offset of each of the `rows` rows from data's first element: the rows are every index of the leading
// dimensions, in order.
std::vector<int64_t> row_offsets(const at::Tensor& data, int64_t rows) {
  const int64_t leading = data.dim() - 1;
  std::vector<int64_t> offsets(rows);
  std::vector<int64_t> index(leading, 0);
  int64_t offset = 0;
  for (int64_t r = 0; r < rows; ++r) {
    offsets[r] = offset;
    // Odometer step over the leading dimensions, last fastest.
    for (int64_t d = leading - 1; d >= 0; --d) {
      offset += data.stride(d);
      if (++index[d] < data.size(d)) {
        break;
      }
      offset -= data.stride(d) * data.size(d);
      index[d] = 0;
    }
  }
  return offsets;
}

at::Tensor row_checksum(const at::Tensor& data, Checksum checksum, const char* op) {
  check_data(data, op);
  // Rows must be runs of bytes for zlib; a tensor whose last dimension is strided is copied, any other layout of
  // the leading dimensions is walked through its strides.
  const at::Tensor rows_dense = data.size(-1) <= 1 || data.stride(-1) == 1 ? data : data.contiguous();
  at::Tensor out = at::empty(data.sizes().slice(0, data.dim() - 1), data.options().dtype(at::kLong));
  // One row per output element, also when the rows are empty (their checksum is the initial value).
  const std::vector<int64_t> offsets = row_offsets(rows_dense, out.numel());
  const int64_t length = data.size(-1);
  const uLong initial = checksum(0, Z_NULL, 0);
  const auto* base = static_cast<const Bytef*>(rows_dense.const_data_ptr());
  int64_t* result = out.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(1, length));
  at::parallel_for(0, static_cast<int64_t>(offsets.size()), grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      uLong value = initial;
      for (int64_t done = 0; done < length; done += kMaxChunk) {
        const auto chunk = static_cast<uInt>(std::min(kMaxChunk, length - done));
        value = checksum(value, base + offsets[r] + done, chunk);
      }
      result[r] = static_cast<int64_t>(value);
    }
  });
  return out;
}

at::Tensor row_crc32(const at::Tensor& data) {
  return row_checksum(data, &crc32, "opforge::row_crc32");
}

at::Tensor row_adler32(const at::Tensor& data) {
  return row_checksum(data, &adler32, "opforge::row_adler32");
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(opforge, m) {
  m.set_python_module("opforge.ops.row_crc32");
  m.def("row_crc32(Tensor data) -> Tensor");
  m.def("row_adler32(Tensor data) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge, CPU, m) {
  m.impl("row_crc32", &row_crc32);
  m.impl("row_adler32", &row_adler32);
}

}  // namespace opforge::cpu
