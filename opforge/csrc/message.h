// Numbers and shapes for TORCH_CHECK messages, as std::string made with std::to_string.
//
// Not streamed into TORCH_CHECK: with some toolchains a streamed number or shape killed the process with SIGSEGV, and
// an op's error path must raise wherever it is built (docs/measurements/kernel-notes.md, "message.h").
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
