// A warp copies (or clears) one row: its 32 lanes move consecutive chunks of kUnit bytes, so
// each memory transaction of the warp reads 32 * kUnit contiguous bytes.
#pragma once

#include <minisgl/utils.cuh>

#include <cstddef>

namespace device::warp {

template <std::size_t kUnit>
struct Chunk;  // the type a lane loads at once
template <>
struct Chunk<16> {
  using type = uint4;
};
template <>
struct Chunk<8> {
  using type = uint2;
};
template <>
struct Chunk<4> {
  using type = uint1;
};

template <std::size_t kBytes, std::size_t kUnit>
__device__ __forceinline__ void copy(void *__restrict__ dst, const void *__restrict__ src) {
  static_assert(kBytes % kUnit == 0, "a row is a whole number of chunks");
  using T = typename Chunk<kUnit>::type;
  constexpr std::size_t kChunks = kBytes / kUnit;
  const auto lane = threadIdx.x % kWarpThreads;
  auto out = static_cast<T *>(dst);
  auto in = static_cast<const T *>(src);
#pragma unroll
  for (std::size_t i = lane; i < kChunks; i += kWarpThreads) {
    out[i] = in[i];
  }
}

template <std::size_t kBytes, std::size_t kUnit>
__device__ __forceinline__ void reset(void *__restrict__ dst) {
  static_assert(kBytes % kUnit == 0, "a row is a whole number of chunks");
  using T = typename Chunk<kUnit>::type;
  constexpr std::size_t kChunks = kBytes / kUnit;
  const auto lane = threadIdx.x % kWarpThreads;
  auto out = static_cast<T *>(dst);
#pragma unroll
  for (std::size_t i = lane; i < kChunks; i += kWarpThreads) {
    out[i] = T{};
  }
}

}  // namespace device::warp
