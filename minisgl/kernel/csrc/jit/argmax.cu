// argmax: the greedy token of each row of logits, one block per row.
//
// A reduction, the pattern the copies of store.cu and index.cu do not need: each thread first
// scans a strided share of the row on its own, then the block combines its threads' best
// (value, index) pairs in shared memory, halving the active threads each round. Every round
// reads what other threads wrote in the round before, so each ends with __syncthreads(). Ties go
// to the smaller index, as torch.argmax breaks them.
#include <minisgl/utils.cuh>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace {

struct ArgmaxParams {
  const float *__restrict__ logits;
  std::int64_t *__restrict__ output;
  std::size_t vocab_size;
  std::size_t row_stride;  // elements from one row to the next
};

// Whether (value, index) beats (best, best_index): larger, or as large and earlier.
__device__ __forceinline__ bool better(float value, std::int64_t index, float best,
                                       std::int64_t best_index) {
  return value > best || (value == best && index < best_index);
}

template <unsigned kNumThreads>
__global__ __launch_bounds__(kNumThreads) void argmax_kernel(
    const __grid_constant__ ArgmaxParams params) {
  __shared__ float best_value[kNumThreads];
  __shared__ std::int64_t best_index[kNumThreads];
  const unsigned tid = threadIdx.x;
  const float *row = params.logits + blockIdx.x * params.row_stride;

  float value = -INFINITY;
  std::int64_t index = static_cast<std::int64_t>(params.vocab_size);  // loses every tie
  for (std::size_t j = tid; j < params.vocab_size; j += kNumThreads) {
    if (better(row[j], static_cast<std::int64_t>(j), value, index)) {
      value = row[j];
      index = static_cast<std::int64_t>(j);
    }
  }
  best_value[tid] = value;
  best_index[tid] = index;
  __syncthreads();

  for (unsigned active = kNumThreads / 2; active > 0; active /= 2) {
    if (tid < active &&
        better(best_value[tid + active], best_index[tid + active], best_value[tid],
               best_index[tid])) {
      best_value[tid] = best_value[tid + active];
      best_index[tid] = best_index[tid + active];
    }
    __syncthreads();
  }
  if (tid == 0) params.output[blockIdx.x] = best_index[0];
}

template <unsigned kNumThreads = 128>
struct ArgmaxKernel {
  static void run(const tvm::ffi::TensorView logits, const tvm::ffi::TensorView output) {
    using namespace host;
    static_assert(kNumThreads >= 32 && (kNumThreads & (kNumThreads - 1)) == 0,
                  "the halving rounds need a power of two");
    check_tensor(logits, "logits", 2);
    check_tensor(output, "output", 1);
    RuntimeCheck(logits.dtype().code == kDLFloat && logits.dtype().bits == 32,
                 "logits must be float32");
    RuntimeCheck(output.dtype().code == kDLInt && output.dtype().bits == 64,
                 "output must be int64");
    RuntimeCheck(output.size(0) == logits.size(0), "output must have one entry per row");
    RuntimeCheck(logits.size(1) > 0, "a row must have at least one logit");
    const auto params = ArgmaxParams{
        .logits = static_cast<const float *>(logits.data_ptr()),
        .output = static_cast<std::int64_t *>(output.data_ptr()),
        .vocab_size = static_cast<std::size_t>(logits.size(1)),
        .row_stride = static_cast<std::size_t>(logits.stride(0)),
    };
    const auto rows = static_cast<unsigned>(logits.size(0));
    LaunchKernel(rows, kNumThreads, logits.device())(argmax_kernel<kNumThreads>, params);
  }
};

}  // namespace
