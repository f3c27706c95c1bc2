// store_cache: write a batch's new keys and values into the KV pool in one launch.
//
// Warp w copies token w's key row to row indices[w] of the key cache, then its value row to the
// same row of the value cache. A row is kv_heads * head_dim elements, a few hundred bytes to a
// few KiB, so a warp moving it in 16-byte chunks keeps every load and store coalesced.
#include <minisgl/utils.cuh>
#include <minisgl/warp.cuh>

#include <cstddef>
#include <cstdint>

namespace {

struct StoreKernelParams {
  void *__restrict__ k_cache;
  void *__restrict__ v_cache;
  const void *__restrict__ indices;
  const void *__restrict__ k;
  const void *__restrict__ v;
  std::size_t cache_stride;  // bytes from one row of a cache to the next
  std::size_t input_stride;  // bytes from one token's k (or v) to the next
  std::size_t length;        // tokens in the batch
};

template <std::size_t kNumThreads, std::size_t kRowBytes, std::size_t kUnit, typename Index>
__global__ __launch_bounds__(kNumThreads) void store_kv_cache(
    const __grid_constant__ StoreKernelParams params) {
  constexpr unsigned kWarpsPerBlock = kNumThreads / device::kWarpThreads;
  const auto warp_id = threadIdx.x / device::kWarpThreads + blockIdx.x * kWarpsPerBlock;
  if (warp_id >= params.length) return;  // the last block's spare warps
  const auto slot = static_cast<std::size_t>(static_cast<const Index *>(params.indices)[warp_id]);
  const auto dst = slot * params.cache_stride;
  const auto src = warp_id * params.input_stride;
  device::warp::copy<kRowBytes, kUnit>(device::offset(params.k_cache, dst),
                                       device::offset(params.k, src));
  device::warp::copy<kRowBytes, kUnit>(device::offset(params.v_cache, dst),
                                       device::offset(params.v, src));
}

// row_bytes: bytes of one token's keys; unit: bytes a lane moves at once (16, 8 or 4, what the
// row size, the strides and the addresses allow); num_threads: threads per block.
template <std::size_t kRowBytes, std::size_t kUnit, std::size_t kNumThreads = 128>
struct StoreKernel {
  static void run(const tvm::ffi::TensorView k_cache, const tvm::ffi::TensorView v_cache,
                  const tvm::ffi::TensorView indices, const tvm::ffi::TensorView k,
                  const tvm::ffi::TensorView v) {
    using namespace host;
    static_assert(kNumThreads % device::kWarpThreads == 0);
    check_tensor(k_cache, "k_cache", 2);
    check_tensor(v_cache, "v_cache", 2);
    check_tensor(k, "k", 2);
    check_tensor(v, "v", 2);
    check_tensor(indices, "indices", 1);
    const auto dtype = k_cache.dtype();
    RuntimeCheck(v_cache.dtype() == dtype && k.dtype() == dtype && v.dtype() == dtype,
                 "k_cache, v_cache, k and v must have one dtype");
    RuntimeCheck(is_index_dtype(indices.dtype()), "indices must be int32 or int64");
    const auto row_bytes = k_cache.size(1) * dtype_bytes(dtype);
    RuntimeCheck(row_bytes == kRowBytes, "a row has ", row_bytes, " bytes; this build expects ",
                 kRowBytes);
    RuntimeCheck(v_cache.size(1) == k_cache.size(1) && k.size(1) == k_cache.size(1) &&
                     v.size(1) == k_cache.size(1),
                 "k and v must have as many columns as the caches");
    RuntimeCheck(v_cache.size(0) == k_cache.size(0) && v_cache.stride(0) == k_cache.stride(0),
                 "k_cache and v_cache must have the same shape and strides");
    const auto length = indices.size(0);
    RuntimeCheck(k.size(0) == length && v.size(0) == length && v.stride(0) == k.stride(0),
                 "k and v must have one row per index, with the same strides");
    const auto params = StoreKernelParams{
        .k_cache = k_cache.data_ptr(),
        .v_cache = v_cache.data_ptr(),
        .indices = indices.data_ptr(),
        .k = k.data_ptr(),
        .v = v.data_ptr(),
        .cache_stride = static_cast<std::size_t>(k_cache.stride(0)) * dtype_bytes(dtype),
        .input_stride = static_cast<std::size_t>(k.stride(0)) * dtype_bytes(dtype),
        .length = static_cast<std::size_t>(length),
    };
    constexpr std::size_t kWarpsPerBlock = kNumThreads / device::kWarpThreads;
    const auto blocks = static_cast<unsigned>(div_ceil(params.length, kWarpsPerBlock));
    const auto kernel = indices.dtype().bits == 32
                            ? store_kv_cache<kNumThreads, kRowBytes, kUnit, std::int32_t>
                            : store_kv_cache<kNumThreads, kRowBytes, kUnit, std::int64_t>;
    LaunchKernel(blocks, kNumThreads, k_cache.device())(kernel, params);
  }
};

}  // namespace
