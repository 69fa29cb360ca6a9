// A named, typed, non-owning view of a tensor stored in a model file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace riskkv {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  // Outermost dimension first (PyTorch order): a linear layer's weight is [out_features,
  // in_features] and each of its rows is RowBytes(dtype, in_features) bytes, contiguous.
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace riskkv
