// The check every backward op makes of its incoming gradient: x's shape, dtype and device.
#pragma once

#include <ATen/core/Tensor.h>

#include "message.h"

namespace opforge {

inline void check_grad_matches(const at::Tensor& grad, const at::Tensor& x, const char* op) {
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": grad must have x's shape ", shape_text(x.sizes()), ", got ",
              shape_text(grad.sizes()), ".");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), op, ": grad must have x's dtype ", x.scalar_type(), ", got ",
              grad.scalar_type(), ".");
  TORCH_CHECK(grad.device() == x.device(), op, ": grad must be on x's device ", x.device(), ", got ", grad.device(),
              ".");
}

}  // namespace opforge
