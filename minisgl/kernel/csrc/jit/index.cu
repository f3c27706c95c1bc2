// indexing: output[i] = weights[indices[i]], the embedding lookup, one row per warp.
//
// With tensor parallelism a rank holds rows [start, start + length) of the vocabulary only: a
// token outside that range gets a row of zeros (another rank writes it, and the all-reduce
// adds them). A wide row is split among kNumSplits warps, so a batch of few tokens still keeps
// many warps busy.
#include <minisgl/utils.cuh>
#include <minisgl/warp.cuh>

#include <tvm/ffi/container/tuple.h>
#include <tvm/ffi/optional.h>

#include <bit>
#include <cstddef>
#include <cstdint>

namespace {

struct IndexKernelParams {
  void *__restrict__ output;
  const void *__restrict__ weights;
  const void *__restrict__ indices;
  std::size_t num_warps;  // tokens * kNumSplits
  std::int64_t start;     // first row this rank holds (0 without a range)
  std::int64_t length;    // rows this rank holds
};

template <std::size_t kNumThreads, std::size_t kRowBytes, std::size_t kNumSplits,
          std::size_t kUnit, bool kMasked, typename Index>
__global__ __launch_bounds__(kNumThreads) void index_kernel(
    const __grid_constant__ IndexKernelParams params) {
  constexpr std::size_t kPartBytes = kRowBytes / kNumSplits;
  constexpr unsigned kWarpsPerBlock = kNumThreads / device::kWarpThreads;
  const auto warp_id = threadIdx.x / device::kWarpThreads + blockIdx.x * kWarpsPerBlock;
  if (warp_id >= params.num_warps) return;
  const auto token = warp_id / kNumSplits;
  const auto part = warp_id % kNumSplits;
  const auto row = static_cast<std::int64_t>(static_cast<const Index *>(params.indices)[token]) -
                   params.start;
  void *dst = device::offset(params.output, warp_id * kPartBytes);
  if (kMasked && (row < 0 || row >= params.length)) {
    device::warp::reset<kPartBytes, kUnit>(dst);
    return;
  }
  const void *src = device::offset(params.weights, static_cast<std::size_t>(row) * kRowBytes,
                                   part * kPartBytes);
  device::warp::copy<kPartBytes, kUnit>(dst, src);
}

// row_bytes: bytes of one embedding row; num_splits: warps per row (a power of two);
// unit: bytes a lane moves at once; num_threads: threads per block.
template <std::size_t kRowBytes, std::size_t kNumSplits, std::size_t kUnit,
          std::size_t kNumThreads = 128>
struct IndexKernel {
  static void run(const tvm::ffi::TensorView weights, const tvm::ffi::TensorView indices,
                  const tvm::ffi::TensorView output,
                  tvm::ffi::Optional<tvm::ffi::Tuple<int64_t, int64_t>> vocab_range) {
    using namespace host;
    static_assert(std::has_single_bit(kNumSplits) && kRowBytes % kNumSplits == 0);
    check_tensor(weights, "weights", 2);
    check_tensor(output, "output", 2);
    check_tensor(indices, "indices", 1);
    RuntimeCheck(weights.is_contiguous() && output.is_contiguous(),
                 "weights and output must be contiguous");
    RuntimeCheck(output.dtype() == weights.dtype(), "output and weights must have one dtype");
    RuntimeCheck(is_index_dtype(indices.dtype()), "indices must be int32 or int64");
    RuntimeCheck(output.size(1) == weights.size(1), "output and weights must be as wide");
    RuntimeCheck(output.size(0) == indices.size(0), "output must have a row per index");
    const auto row_bytes = weights.size(1) * dtype_bytes(weights.dtype());
    RuntimeCheck(row_bytes == kRowBytes, "a row has ", row_bytes, " bytes; this build expects ",
                 kRowBytes);
    auto params = IndexKernelParams{
        .output = output.data_ptr(),
        .weights = weights.data_ptr(),
        .indices = indices.data_ptr(),
        .num_warps = static_cast<std::size_t>(indices.size(0)) * kNumSplits,
        .start = 0,
        .length = weights.size(0),
    };
    const bool masked = vocab_range.has_value();
    if (masked) {
      const auto range = vocab_range.value();
      params.start = range.get<0>();
      params.length = range.get<1>();
      RuntimeCheck(params.length <= weights.size(0), "the vocabulary range has ", params.length,
                   " rows, weights only ", weights.size(0));
    }
    constexpr std::size_t kWarpsPerBlock = kNumThreads / device::kWarpThreads;
    const auto blocks = static_cast<unsigned>(div_ceil(params.num_warps, kWarpsPerBlock));
    const bool int32 = indices.dtype().bits == 32;
    const auto kernel =
        masked ? (int32 ? index_kernel<kNumThreads, kRowBytes, kNumSplits, kUnit, true, int32_t>
                        : index_kernel<kNumThreads, kRowBytes, kNumSplits, kUnit, true, int64_t>)
               : (int32 ? index_kernel<kNumThreads, kRowBytes, kNumSplits, kUnit, false, int32_t>
                        : index_kernel<kNumThreads, kRowBytes, kNumSplits, kUnit, false, int64_t>);
    LaunchKernel(blocks, kNumThreads, weights.device())(kernel, params);
  }
};

}  // namespace
