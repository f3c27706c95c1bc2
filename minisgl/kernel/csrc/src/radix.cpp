// fast_compare_key: how many leading token ids two 1-D CPU tensors share.
//
// The radix cache calls it at every node a prompt walks through. The ids live on the CPU, so
// this is plain C++: std::mismatch over the two buffers costs nanoseconds, where the same
// comparison in PyTorch (an elementwise != and a search for the first True) costs microseconds
// of operator dispatch.
#include <minisgl/utils.cuh>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace {

void check_key(const tvm::ffi::TensorView &t, const char *name) {
  host::RuntimeCheck(t.ndim() == 1 && t.is_contiguous() && t.device().device_type == kDLCPU &&
                         host::is_index_dtype(t.dtype()),
                     name, " must be a contiguous 1-D int32 or int64 tensor on the CPU");
}

template <typename T>
std::int64_t common_prefix(const void *a, const void *b, std::int64_t n) {
  const auto x = static_cast<const T *>(a);
  const auto y = static_cast<const T *>(b);
  return std::mismatch(x, x + n, y).first - x;
}

std::int64_t fast_compare_key(const tvm::ffi::TensorView a, const tvm::ffi::TensorView b) {
  check_key(a, "the first key");
  check_key(b, "the second key");
  host::RuntimeCheck(a.dtype().bits == b.dtype().bits, "the keys must have one dtype");
  const auto n = std::min(a.size(0), b.size(0));
  return a.dtype().bits == 64 ? common_prefix<std::int64_t>(a.data_ptr(), b.data_ptr(), n)
                              : common_prefix<std::int32_t>(a.data_ptr(), b.data_ptr(), n);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(fast_compare_key, fast_compare_key);
