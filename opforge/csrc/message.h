// Numbers and shapes for TORCH_CHECK messages, as std::string made with std::to_string.
//
// Why not stream them (TORCH_CHECK(ok, "got ", x.dim(), " of shape ", x.sizes())): on the H200 image of 2026-12-03
// (torch 2.11.0+cu130 built with gcc-toolset-13, extensions built by Ubuntu 24.04's g++ 13.3) streaming an integer,
// a double or a shape into the message killed the process with SIGSEGV, in .cpp and .cu files alike, while strings,
// dtypes and std::to_string text raised as they should (docs/measurements/h200-message-crash-2026-12-03.txt). An op's
// error path must raise wherever it is built; `opforge doctor --build` reports such a toolchain.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace opforge {

inline std::string number_text(int64_t value) {
  return std::to_string(value);
}

// "[4, 7]", as PyTorch prints a shape.
inline std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

}  // namespace opforge
