"""Chapter 19: the engine's kernels, each held to its PyTorch reference, and the simulator that
runs the CUDA ones on a CPU held to CUDA's rules.

On a CPU the CUDA files are built by the host compiler against minisgl/sim.h and Triton runs
in its interpreter; on a GPU the same tests run the compiled kernels.
"""

from __future__ import annotations

from typing import Tuple

import pytest
import torch

from minisgl.kernel import argmax, fast_compare_key, indexing, store_cache  # noqa: E402
from minisgl.kernel.index import indexing_reference  # noqa: E402
from minisgl.kernel.radix import compare_key_reference  # noqa: E402
from minisgl.kernel.store import store_cache_reference  # noqa: E402
from minisgl.kernel.utils import KERNEL_PATH, chunk_bytes, load_source  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def kv_batch(tokens: int, width: int, dtype: torch.dtype, index_dtype=torch.int32) -> Tuple:
    g = torch.Generator().manual_seed(tokens * 7 + width)
    qkv = torch.randn(tokens, 3 * width, generator=g).to(DEVICE, dtype)
    k, v = qkv[:, width : 2 * width], qkv[:, 2 * width :]  # strided views, as the model has them
    slots = torch.randperm(256, generator=g)[:tokens].to(DEVICE, index_dtype)
    return slots, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("tokens,heads,head_dim", [(1, 1, 32), (5, 2, 16), (70, 4, 64)])
def test_store_cache_writes_what_pytorch_writes(dtype, index_dtype, tokens, heads, head_dim):
    slots, k, v = kv_batch(tokens, heads * head_dim, dtype, index_dtype)
    ours = [torch.zeros(256, heads, head_dim, device=DEVICE, dtype=dtype) for _ in range(2)]
    reference = [c.clone() for c in ours]
    store_cache(*ours, slots, k, v)
    store_cache_reference(*reference, slots, k, v)
    assert torch.equal(ours[0], reference[0]) and torch.equal(ours[1], reference[1])


def test_store_cache_of_no_tokens_does_nothing():
    caches = [torch.zeros(8, 1, 32, device=DEVICE) for _ in range(2)]
    empty = torch.empty(0, 32, device=DEVICE)
    store_cache(*caches, torch.empty(0, dtype=torch.int32, device=DEVICE), empty, empty)
    assert not caches[0].any()


def test_the_kernels_refuse_what_they_cannot_do():
    caches = [
        torch.zeros(8, 1, 32, device=DEVICE, dtype=dtype)
        for dtype in (torch.float32, torch.float16)
    ]
    k = torch.zeros(2, 32, device=DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="one dtype"):  # the two caches differ
        store_cache(*caches, slots, k, k)
    with pytest.raises(ValueError, match="int32 or int64"):
        indexing(torch.zeros(4, 32, device=DEVICE), slots.float())
    with pytest.raises(ValueError, match="1-D int32 or int64 tensor on the CPU"):
        fast_compare_key(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="chunks of 4 bytes"):
        chunk_bytes(6)


@pytest.mark.parametrize("width", [16, 64, 256, 512, 1024])
@pytest.mark.parametrize("vocab_range", [None, (0, 100), (100, 100), (200, 57)])
def test_indexing_gathers_what_pytorch_gathers(width, vocab_range):
    g = torch.Generator().manual_seed(width)
    rows = 257 if vocab_range is None else vocab_range[1]
    weights = torch.randn(rows, width, generator=g).to(DEVICE)
    ids = torch.randint(0, 257, (41,), generator=g).to(DEVICE)
    ours = indexing(weights, ids, vocab_range=vocab_range)
    assert torch.equal(ours, indexing_reference(weights, ids, vocab_range=vocab_range))


def test_indexing_writes_into_the_given_output():
    weights = torch.randn(10, 64, device=DEVICE)
    out = torch.full((3, 64), 7.0, device=DEVICE)
    ids = torch.tensor([9, 0, 4], device=DEVICE, dtype=torch.int32)
    assert indexing(weights, ids, output=out) is out
    assert torch.equal(out, weights[ids.long()])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_fast_compare_key_finds_the_first_difference(dtype):
    a = torch.arange(1000, dtype=dtype)
    for b in [
        a.clone(),
        a[:10].clone(),
        torch.cat([a[:333], -a[333:]]),
        torch.zeros(0, dtype=dtype),
    ]:
        assert fast_compare_key(a, b) == compare_key_reference(a, b) == fast_compare_key(b, a)


def test_fast_compare_key_compares_ids_of_two_integer_types():
    a = torch.arange(50, dtype=torch.int32)
    b = torch.cat([torch.arange(20), torch.tensor([-1])])  # int64
    assert fast_compare_key(a, b) == 20 == fast_compare_key(b, a)


def test_argmax_breaks_ties_like_torch():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 3001, generator=g)
    logits[1] = 1.0  # every logit ties
    logits[2, 5] = logits[2, 3000] = 99.0
    logits[4, -1] = 99.0  # the last column
    logits = logits.to(DEVICE)
    assert torch.equal(argmax(logits), torch.argmax(logits, dim=-1))


def test_the_triton_store_writes_what_pytorch_writes():
    from minisgl.kernel.triton.store import store_cache_triton

    slots, k, v = kv_batch(33, 3 * 40, torch.float32)  # rows of 120: not a power of two
    ours = [torch.zeros(256, 3, 40, device=DEVICE) for _ in range(2)]
    reference = [c.clone() for c in ours]
    store_cache_triton(*ours, slots, k, v)
    store_cache_reference(*reference, slots, k, v)
    assert torch.equal(ours[0], reference[0]) and torch.equal(ours[1], reference[1])


# ------------------------------------------------------------------ the simulator's rules
cpu_only = pytest.mark.skipif(DEVICE != "cpu", reason="the simulator runs on the CPU only")


def build(name: str, body: str, wrapper: str):
    return load_source(name, "#include <minisgl/utils.cuh>\n" + body, wrapper)


WARP_SUM = """
namespace {
__global__ void warp_sum(const float *x, float *out) {
  float value = x[blockIdx.x * blockDim.x + threadIdx.x];
  for (int mask = 16; mask > 0; mask /= 2) value += __shfl_xor_sync(0xffffffffu, value, mask);
  out[blockIdx.x * blockDim.x + threadIdx.x] = value;  // every lane has the warp's sum
}
void run(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
  host::LaunchKernel(x.size(0) / 64, 64, x.device())(
      warp_sum, static_cast<const float *>(x.data_ptr()), static_cast<float *>(out.data_ptr()));
}
}  // namespace
"""


@cpu_only
def test_the_simulator_shuffles_within_a_warp():
    module = build("warp_sum", WARP_SUM, "TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, run);")
    x = torch.arange(256, dtype=torch.float32)
    out = torch.empty(256)
    module.run(x, out)
    expected = x.view(-1, 32).sum(dim=1, keepdim=True).expand(-1, 32).reshape(-1)
    assert torch.equal(out, expected)


EARLY_EXIT = """
namespace {
__global__ void early_exit(float *out) {
  __shared__ float seen[64];
  if (threadIdx.x >= 60) return;  // four threads skip the barrier the others wait at
  seen[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = seen[(threadIdx.x + 1) % 64];
}
void run(tvm::ffi::TensorView out) {
  host::LaunchKernel(2, 64, out.device())(early_exit, static_cast<float *>(out.data_ptr()));
}
}  // namespace
"""


@cpu_only
def test_a_barrier_that_some_threads_skip_is_an_error_not_a_hang():
    module = build("early_exit", EARLY_EXIT, "TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, run);")
    with pytest.raises(Exception, match=r"60 threads wait at __syncthreads\(\) that 4 threads"):
        module.run(torch.empty(64))


@cpu_only
def test_the_simulator_shows_a_missing_syncthreads():
    source = (KERNEL_PATH / "jit" / "argmax.cu").read_text()
    assert "__syncthreads();" in source
    broken = load_source(
        "argmax_no_barrier",
        source.replace("__syncthreads();", ""),
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch, (ArgmaxKernel<128>::run));",
    )
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(1))
    out = torch.empty(8, dtype=torch.int64)
    broken.launch(logits, out)
    assert not torch.equal(out, torch.argmax(logits, dim=-1))
    argmax(logits)  # the kernel as written is right (test_argmax_breaks_ties_like_torch)


@cpu_only
def test_the_simulator_shows_a_missing_block_index():
    source = (KERNEL_PATH / "jit" / "store.cu").read_text()
    broken = load_source(
        "store_no_block",
        source.replace("+ blockIdx.x * kWarpsPerBlock", ""),
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch, (StoreKernel<128, 16, 128>::run));",
    )
    slots, k, v = kv_batch(9, 32, torch.float32)
    caches = [torch.zeros(256, 32) for _ in range(2)]
    broken.launch(*caches, slots, k, v)
    stored = caches[0][slots.long()].ne(0).any(dim=1)
    assert stored[:4].all() and not stored[4:].any()  # only block 0's four warps wrote


def test_a_build_is_named_after_everything_that_goes_into_it(tmp_path, monkeypatch):
    from minisgl.kernel import utils

    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path))
    first = utils._build_directory("k", ["int x;"], ["-O2"])
    assert first.parent == tmp_path / "minisgl"
    assert utils._build_directory("k", ["int x;"], ["-O2"]) == first
    assert utils._build_directory("k", ["int y;"], ["-O2"]) != first
    assert utils._build_directory("k", ["int x;"], ["-O3"]) != first


def test_one_build_serves_every_copy_of_the_tree(tmp_path, monkeypatch):
    """steps.py checks each chapter in a copy of the tree of its own. A kernel built in one copy
    is loaded, not compiled again, in the next: its build names no path of either copy."""
    import shutil

    from minisgl.kernel import utils

    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path / "cache"))
    source = "#include <minisgl/utils.cuh>\nint64_t twice(int64_t x) { return 2 * x; }\n"
    wrapper = "TVM_FFI_DLL_EXPORT_TYPED_FUNC(twice, twice);"
    built = []
    for copy in ("first", "second"):
        include = shutil.copytree(KERNEL_PATH / "include", tmp_path / copy / "include")
        monkeypatch.setattr(utils, "DEFAULT_INCLUDE", [str(include)])
        assert load_source("twice", source, wrapper).twice(21) == 42
        [library] = (tmp_path / "cache").rglob("*.so")
        built.append((library, library.stat().st_mtime_ns))
        assert copy not in (library.parent / "build.ninja").read_text()
    assert built[0] == built[1]


# ------------------------------------------------------------------ FlashInfer's small kernels
gpu_16_bit = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="FlashInfer's fused kernels run on a GPU only"
)


@gpu_16_bit
def test_flashinfers_small_kernels_compute_what_the_pytorch_code_computes():
    """In bfloat16 on a GPU the norms, SiLU-and-mul and RoPE call FlashInfer; each agrees with
    the float32 PyTorch code to bfloat16's precision (8 bits of mantissa)."""
    from minisgl.layers.activation import silu_and_mul
    from minisgl.layers.gpu import flashinfer_for
    from minisgl.layers.norm import RMSNorm, RMSNormFused, rms_norm
    from minisgl.layers.rotary import RotaryEmbedding

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, 256, device="cuda", generator=g).bfloat16()
    if flashinfer_for(x) is None:
        pytest.skip("FlashInfer is not installed")
    close = dict(atol=2e-2, rtol=2e-2)
    norm = RMSNorm(256, 1e-6)
    norm.weight = torch.rand(256, device="cuda", generator=g).bfloat16() + 0.5
    expected = rms_norm(x.float(), norm.weight.float(), 1e-6)
    torch.testing.assert_close(norm.forward(x).float(), expected, **close)
    fused = RMSNormFused(256, 1e-6)
    fused.weight = norm.weight
    residual = torch.randn(37, 256, device="cuda", generator=g).bfloat16()
    total = (x.float() + residual.float()).bfloat16().float()
    out, stream = fused.forward(x.clone(), residual.clone())
    torch.testing.assert_close(stream.float(), total, **close)
    torch.testing.assert_close(out.float(), rms_norm(total, norm.weight.float(), 1e-6), **close)
    gate_up = torch.randn(37, 512, device="cuda", generator=g).bfloat16()
    gate, up = gate_up.float().chunk(2, dim=-1)
    torch.testing.assert_close(
        silu_and_mul(gate_up).float(), torch.nn.functional.silu(gate) * up, **close
    )
    rope = RotaryEmbedding(64, 64, 4096, 1e6)
    rope._cos_sin_cache = rope._cos_sin_cache.cuda()
    positions = torch.randint(0, 4096, (37,), device="cuda", generator=g)
    q = torch.randn(37, 4 * 64, device="cuda", generator=g).bfloat16()
    k = torch.randn(37, 2 * 64, device="cuda", generator=g).bfloat16()
    q32, k32 = q.float(), k.float()
    rope.forward(positions, q32, k32)  # float32: the PyTorch code
    rope.forward(positions, q, k)  # bfloat16: FlashInfer's kernel
    torch.testing.assert_close(q.float(), q32, **close)
    torch.testing.assert_close(k.float(), k32, **close)
