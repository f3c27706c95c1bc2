// What every kernel file includes: device helpers, and on the host side the argument checks and
// the launch. Compiled by nvcc it launches on the GPU; compiled by the host compiler it runs the
// same kernel on the CPU through minisgl/sim.h.
#pragma once

#ifndef __CUDACC__
#include <minisgl/sim.h>
#endif

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <utility>

namespace device {

inline constexpr unsigned kWarpThreads = 32;

// Byte offsets only: arithmetic on a typed pointer would scale by the type's size.
template <std::integral... U>
__device__ __forceinline__ void *offset(void *ptr, U... bytes) {
  return static_cast<char *>(ptr) + (std::size_t{0} + ... + static_cast<std::size_t>(bytes));
}

template <std::integral... U>
__device__ __forceinline__ const void *offset(const void *ptr, U... bytes) {
  return static_cast<const char *>(ptr) + (std::size_t{0} + ... + static_cast<std::size_t>(bytes));
}

}  // namespace device

namespace host {

#ifdef __CUDACC__
inline constexpr DLDeviceType kDevice = kDLCUDA;
#else
inline constexpr DLDeviceType kDevice = kDLCPU;
#endif

// A failed check raises ValueError in Python with the message.
template <typename... Args>
void RuntimeCheck(bool ok, const Args &...message) {
  if (ok) [[likely]] {
    return;
  }
  std::ostringstream text;
  (text << ... << message);
  TVM_FFI_THROW(ValueError) << text.str();
}

inline std::size_t dtype_bytes(DLDataType dtype) { return (dtype.bits * dtype.lanes + 7) / 8; }

inline bool is_index_dtype(DLDataType dtype) {
  return dtype.code == kDLInt && (dtype.bits == 32 || dtype.bits == 64) && dtype.lanes == 1;
}

// A 1-D or 2-D tensor on the device this file was compiled for, rows of unit stride.
inline void check_tensor(const tvm::ffi::TensorView &t, const char *name, int ndim) {
  RuntimeCheck(t.ndim() == ndim, name, " must have ", ndim, " dimensions, not ", t.ndim());
  RuntimeCheck(t.device().device_type == kDevice, name, " is on the wrong device (",
               kDevice == kDLCUDA ? "this build runs on a GPU" : "this build runs on the CPU",
               ")");
  RuntimeCheck(t.stride(ndim - 1) == 1, name, "'s last dimension must have stride 1");
}

template <std::integral T, std::integral U>
constexpr auto div_ceil(T a, U b) {
  return (a + b - 1) / b;
}

// LaunchKernel(grid, block, device)(kernel, args...): kernel<<<grid, block>>>(args...) on the
// stream the caller (PyTorch) works on, or the same grid run by the simulator.
class LaunchKernel {
 public:
  LaunchKernel(dim3 grid, dim3 block, DLDevice device) : grid_(grid), block_(block) {
#ifdef __CUDACC__
    stream_ = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
#else
    (void)device;
#endif
  }

  template <typename... Params, typename... Args>
  void operator()(void (*kernel)(Params...), Args &&...args) const {
    if (grid_.x * grid_.y * grid_.z == 0) return;  // nothing to do; a GPU rejects an empty grid
#ifdef __CUDACC__
    kernel<<<grid_, block_, 0, stream_>>>(std::forward<Args>(args)...);
    const cudaError_t error = cudaGetLastError();
    RuntimeCheck(error == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(error));
#else
    sim::launch(grid_, block_, [&] { kernel(args...); });
#endif
  }

 private:
  dim3 grid_, block_;
#ifdef __CUDACC__
  cudaStream_t stream_;
#endif
};

}  // namespace host
