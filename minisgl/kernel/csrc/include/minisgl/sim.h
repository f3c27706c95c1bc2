// CUDA on the CPU: the built-ins a kernel uses, for the host compiler.
//
// A kernel written for nvcc compiles unchanged with g++ or clang++ once this header has defined
// what nvcc provides: the qualifiers (__global__, __shared__ ...), threadIdx, blockIdx,
// blockDim, gridDim, __syncthreads(), the warp shuffles, atomics and the vector types.
// sim::launch then runs the grid block by block. The threads of a block run one at a time, each
// on its own stack (a ucontext fiber), until it reaches a barrier or returns; a barrier lets the
// threads on by only when every thread of its block (or warp) has reached it. So the order is
// fixed and a bug shows itself every time: a thread that reads shared memory another thread
// has not written yet (a missing __syncthreads) reads what the previous block left there, and a
// barrier that some threads skip is an error instead of a hang.
#pragma once

#ifdef __CUDACC__
#error "minisgl/sim.h is for the host compiler: nvcc has the real built-ins"
#endif

#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint1 {
  unsigned x;
};
struct uint2 {
  unsigned x, y;
};
struct uint4 {
  unsigned x, y, z, w;
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __grid_constant__
// One copy per OS thread: the threads of a block share it, since they all run on one.
#define __shared__ static thread_local

namespace sim {

inline constexpr unsigned kWarpSize = 32;
inline constexpr std::size_t kStackBytes = 64 * 1024;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Thread {
  ucontext_t context;
  dim3 index;
  State state = State::kRunnable;
};

// The block being run on this OS thread.
struct Block {
  dim3 block_idx, block_dim, grid_dim;
  std::vector<Thread> threads;
  char *stacks = nullptr;
  std::vector<std::uint64_t> exchange;  // a slot per thread for the warp shuffles
  ucontext_t scheduler;
  Thread *current = nullptr;
  const std::function<void()> *body = nullptr;
  std::string error;
};

inline Block *&current_block() {
  static thread_local Block *block = nullptr;
  return block;
}

inline Block &block() {
  Block *b = current_block();
  if (b == nullptr) throw std::logic_error("a CUDA built-in was used outside sim::launch");
  return *b;
}

inline unsigned linear_thread_id() {
  const Block &b = block();
  const dim3 &t = b.current->index;
  return t.x + b.block_dim.x * (t.y + b.block_dim.y * t.z);
}

// Give the CPU back to the scheduler until the barrier this thread waits at is released.
inline void wait_at(State state) {
  Block &b = block();
  Thread *self = b.current;
  self->state = state;
  swapcontext(&self->context, &b.scheduler);
}

inline void thread_entry() {
  Block &b = block();
  (*b.body)();
  b.current->state = State::kDone;  // uc_link returns to the scheduler
}

// Release the barriers every thread concerned has reached; report a barrier some threads skip.
inline bool release_barriers(Block &b) {
  const std::size_t n = b.threads.size();
  bool released = false;
  for (std::size_t first = 0; first < n; first += kWarpSize) {
    const std::size_t last = std::min(n, first + kWarpSize);
    std::size_t waiting = 0, done = 0;
    for (std::size_t i = first; i < last; ++i) {
      waiting += b.threads[i].state == State::kAtWarpBarrier;
      done += b.threads[i].state == State::kDone;
    }
    if (waiting == last - first) {
      for (std::size_t i = first; i < last; ++i) b.threads[i].state = State::kRunnable;
      released = true;
    } else if (waiting > 0 && done > 0) {
      b.error = "warp " + std::to_string(first / kWarpSize) +
                ": some lanes wait in a shuffle or __syncwarp() that other lanes exited without";
      return false;
    }
  }
  if (released) return true;
  std::size_t at_block = 0, done = 0;
  for (const Thread &t : b.threads) {
    at_block += t.state == State::kAtBlockBarrier;
    done += t.state == State::kDone;
  }
  if (at_block == n) {
    for (Thread &t : b.threads) t.state = State::kRunnable;
    return true;
  }
  if (at_block > 0 && at_block + done == n) {
    b.error = "block (" + std::to_string(b.block_idx.x) + ", " + std::to_string(b.block_idx.y) +
              ", " + std::to_string(b.block_idx.z) + "): " + std::to_string(at_block) +
              " threads wait at __syncthreads() that " + std::to_string(done) +
              " threads exited without (undefined behaviour on a GPU)";
  } else if (at_block + done != n) {
    b.error = "threads of one warp wait at __syncthreads() while others wait in a shuffle";
  }
  return false;
}

inline void run_block(Block &b) {
  const std::size_t n = b.threads.size();
  for (std::size_t i = 0; i < n; ++i) {
    Thread &t = b.threads[i];
    t.state = State::kRunnable;
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = b.stacks + i * kStackBytes;
    t.context.uc_stack.ss_size = kStackBytes;
    t.context.uc_link = &b.scheduler;
    makecontext(&t.context, thread_entry, 0);
  }
  while (true) {
    for (Thread &t : b.threads) {
      if (t.state != State::kRunnable) continue;
      b.current = &t;
      swapcontext(&b.scheduler, &t.context);
    }
    b.current = nullptr;
    bool all_done = true;
    for (const Thread &t : b.threads) all_done &= t.state == State::kDone;
    if (all_done) return;
    if (!release_barriers(b)) throw std::runtime_error("simulated kernel: " + b.error);
  }
}

// Run `body` once for every thread of a grid_dim x block_dim launch, block after block.
inline void launch(dim3 grid_dim, dim3 block_dim, const std::function<void()> &body) {
  const std::size_t threads = std::size_t{block_dim.x} * block_dim.y * block_dim.z;
  if (threads == 0 || threads > 1024) {
    throw std::invalid_argument("a block has 1 to 1024 threads, not " + std::to_string(threads));
  }
  Block b;
  b.grid_dim = grid_dim;
  b.block_dim = block_dim;
  b.threads.resize(threads);
  // the stacks are kept for the next launch on this OS thread (mapping fresh memory costs more
  // than the kernel); a launch from inside a kernel is not supported
  static thread_local std::unique_ptr<char[]> stack_pool;
  static thread_local std::size_t stack_pool_bytes = 0;
  if (current_block() != nullptr) throw std::logic_error("a kernel cannot launch a kernel here");
  if (stack_pool_bytes < threads * kStackBytes) {
    stack_pool.reset(new char[threads * kStackBytes]);  // left uninitialised: no memset
    stack_pool_bytes = threads * kStackBytes;
  }
  b.stacks = stack_pool.get();
  b.exchange.resize(threads);
  b.body = &body;
  for (unsigned z = 0; z < block_dim.z; ++z)
    for (unsigned y = 0; y < block_dim.y; ++y)
      for (unsigned x = 0; x < block_dim.x; ++x)
        b.threads[x + block_dim.x * (y + block_dim.y * z)].index = dim3(x, y, z);
  current_block() = &b;
  try {
    for (unsigned z = 0; z < grid_dim.z; ++z)
      for (unsigned y = 0; y < grid_dim.y; ++y)
        for (unsigned x = 0; x < grid_dim.x; ++x) {
          b.block_idx = dim3(x, y, z);
          run_block(b);
        }
  } catch (...) {
    current_block() = nullptr;
    throw;
  }
  current_block() = nullptr;
}

template <typename T>
T shuffle(T value, unsigned source_lane) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t), "a shuffle moves at most 8 bytes");
  Block &b = block();
  const unsigned self = linear_thread_id();
  const unsigned lane0 = self - self % kWarpSize;
  std::memcpy(&b.exchange[self], &value, sizeof(T));
  wait_at(State::kAtWarpBarrier);  // every lane has written its value
  T result;
  std::memcpy(&result, &b.exchange[lane0 + source_lane % kWarpSize], sizeof(T));
  wait_at(State::kAtWarpBarrier);  // every lane has read before the slots are reused
  return result;
}

}  // namespace sim

#define threadIdx (::sim::block().current->index)
#define blockIdx (::sim::block().block_idx)
#define blockDim (::sim::block().block_dim)
#define gridDim (::sim::block().grid_dim)

inline void __syncthreads() { ::sim::wait_at(::sim::State::kAtBlockBarrier); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::sim::wait_at(::sim::State::kAtWarpBarrier); }

template <typename T>
T __shfl_xor_sync(unsigned /*mask*/, T value, int lane_mask, int /*width*/ = 32) {
  return ::sim::shuffle(value, (::sim::linear_thread_id() % ::sim::kWarpSize) ^ lane_mask);
}

template <typename T>
T __shfl_sync(unsigned /*mask*/, T value, int source_lane, int /*width*/ = 32) {
  return ::sim::shuffle(value, static_cast<unsigned>(source_lane));
}

// One thread runs at a time, so an atomic is an ordinary read-modify-write.
template <typename T>
T atomicAdd(T *address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
