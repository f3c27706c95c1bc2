"""Chapter 18: CUDA graphs, emulated on the CPU. Which sizes are captured and how a batch is
padded; that every backend replays to the eager engine's tokens; that the emulation refuses
what CUDA refuses and gives the wrong tokens a real graph gives when an input or the metadata
is not copied; that the model never waits for the device; FlashInfer's graph wrapper."""

from __future__ import annotations

from typing import Dict, List
from unittest.mock import patch

import pytest
import torch

from examples.helpers.gpu_libraries import use_standins

use_standins(always=True)  # the tests run on the CPU, where the real ones have no kernels

from minisgl.core import Batch, SamplingParams  # noqa: E402
from minisgl.engine.graph import GraphCaptureBuffer, _determine_cuda_graph_bs  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.utils.cpu_graph import EmulatedGraph, GraphContractError, _Watch  # noqa: E402
from tools.models import ensure_model  # noqa: E402
from tools.parity import build_prompts  # noqa: E402

MODEL = "tiny-qwen3"
SIZES = [1, 2, 4]
GiB = 1 << 30


def make_llm(backend: str = "torch", graphs: List[int] | None = SIZES, **kwargs) -> LLM:
    settings = dict(cuda_graph_bs=graphs) if graphs else dict(cuda_graph_max_bs=0)
    return LLM(
        str(ensure_model(MODEL)), dtype=torch.float32, attention_backend=backend, page_size=4,
        num_page_override=256, max_running_req=8, **settings, **kwargs,
    )  # fmt: skip


def generate(llm: LLM, lengths=(8, 16, 24)) -> List[List[int]]:
    """Three prompts that stop at different lengths: decode batches of 3, 2 and 1."""
    prompts = build_prompts(MODEL)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    return [o["token_ids"] for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def eager_tokens() -> List[List[int]]:
    with make_llm(graphs=None) as llm:
        return generate(llm)


# ------------------------------------------------------------------------ sizes, padding
def test_the_batch_sizes_captured() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert _determine_cuda_graph_bs(None, None, 100 * GiB, cpu) == []  # off unless asked
    large = _determine_cuda_graph_bs(None, None, 100 * GiB, gpu)
    assert large[:4] == [1, 2, 4, 8] and large[-1] == 256 and len(large) == 35
    assert _determine_cuda_graph_bs(None, None, 40 * GiB, gpu)[-1] == 160
    assert _determine_cuda_graph_bs(None, 12, 0, cpu) == [1, 2, 4, 8]
    assert _determine_cuda_graph_bs(None, 3, 0, gpu) == [1, 2]
    assert _determine_cuda_graph_bs(None, 0, 100 * GiB, gpu) == []
    assert _determine_cuda_graph_bs([4, 1, 4], None, 0, cpu) == [1, 4]


def test_a_decode_batch_is_padded_to_the_next_captured_size() -> None:
    with make_llm() as llm:
        runner = llm.engine.graph_runner
        assert sorted(runner.graph_map) == SIZES
        padded = {}
        for size in range(1, 6):
            batch = Batch(reqs=[runner.dummy_req] * size, phase="decode")
            runner.pad_batch(batch)
            padded[size] = batch.padded_size if runner.can_use_cuda_graph(batch) else None
        assert padded == {1: 1, 2: 2, 3: 4, 4: 4, 5: None}
        prefill = Batch(reqs=[runner.dummy_req] * 3, phase="prefill")
        runner.pad_batch(prefill)
        assert prefill.padded_size == 3 and not runner.can_use_cuda_graph(prefill)


# ------------------------------------------------------------------------ replay = eager
@pytest.mark.parametrize("backend", ["torch", "fi", "fa", "fa,fi"])
def test_graphs_give_the_eager_engines_tokens(backend: str, eager_tokens) -> None:
    with make_llm(backend) as llm:
        runner = llm.engine.graph_runner
        replayed: Dict[int, int] = {}
        replay = runner.replay

        def counting(batch: Batch) -> torch.Tensor:
            replayed[batch.padded_size] = replayed.get(batch.padded_size, 0) + 1
            return replay(batch)

        runner.replay = counting  # type: ignore[method-assign]
        assert generate(llm) == eager_tokens
    assert replayed == {4: 7, 2: 8, 1: 8}  # 3 requests for 7 steps, then 2 for 8, then 1


def test_the_hybrid_backend_captures_with_its_decode_backend() -> None:
    from minisgl.attention.base import BaseAttnBackend, HybridBackend

    calls: List[str] = []

    class Recorder(BaseAttnBackend):
        def __init__(self, name: str) -> None:
            self.name = name

        def forward(self, q, k, v, layer_id, batch):  # type: ignore[no-untyped-def]
            return q

        def prepare_metadata(self, batch) -> None:  # type: ignore[no-untyped-def]
            calls.append(f"{self.name}.prepare_metadata")

        def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
            calls.append(f"{self.name}.init_capture_graph")

        def prepare_for_capture(self, batch) -> None:  # type: ignore[no-untyped-def]
            calls.append(f"{self.name}.prepare_for_capture")

        def prepare_for_replay(self, batch) -> None:  # type: ignore[no-untyped-def]
            calls.append(f"{self.name}.prepare_for_replay")

    hybrid = HybridBackend(Recorder("prefill"), Recorder("decode"))
    batch = Batch(reqs=[], phase="decode")
    hybrid.init_capture_graph(64, SIZES)
    hybrid.prepare_for_capture(batch)
    hybrid.prepare_for_replay(batch)
    assert calls == ["decode.init_capture_graph", "decode.prepare_for_capture",
                     "decode.prepare_for_replay"]  # fmt: skip


# ------------------------------------------------------------------------ what goes wrong
def test_an_input_not_copied_into_its_buffer_gives_wrong_tokens(eager_tokens) -> None:
    def copy_from(self: GraphCaptureBuffer, batch: Batch) -> None:
        rows = slice(batch.padded_size)
        self.input_ids[rows].copy_(batch.input_ids)  # out_loc and positions forgotten

    with patch.object(GraphCaptureBuffer, "copy_from", copy_from), make_llm() as llm:
        assert generate(llm) != eager_tokens


@pytest.mark.parametrize("backend", ["torch", "fi", "fa"])
def test_metadata_not_copied_for_the_replay_gives_wrong_tokens(backend: str, eager_tokens):
    with make_llm(backend) as llm:
        with patch.object(llm.engine.attn_backend, "prepare_for_replay", lambda batch: None):
            assert generate(llm) != eager_tokens


def test_a_host_read_in_the_step_is_refused_at_capture() -> None:
    from minisgl.attention.native import TorchNativeBackend

    original = TorchNativeBackend.forward

    def reads_a_length(self, q, k, v, layer_id, batch):  # type: ignore[no-untyped-def]
        batch.attn_metadata.kv_valid.sum().item()
        return original(self, q, k, v, layer_id, batch)

    with patch.object(TorchNativeBackend, "forward", reads_a_length):
        with pytest.raises(GraphContractError, match=r"capturing a CUDA graph: item\(\)"):
            make_llm()
    from minisgl.core import clear_global_ctx
    from minisgl.distributed import reset_tp_info

    clear_global_ctx()
    reset_tp_info()


def test_weights_loaded_after_the_capture_are_refused_at_replay() -> None:
    with make_llm() as llm:
        model = llm.engine.model
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        with pytest.raises(GraphContractError, match="that the capture never read"):
            generate_one_replay(llm)


def generate_one_replay(llm: LLM) -> None:
    llm.engine.graph_runner.graph_map[1].replay()


# ------------------------------------------------------------------------ the emulation
def test_a_replay_reads_its_buffers_as_they_are_then() -> None:
    x, out = torch.tensor([1.0, 2.0]), torch.zeros(2)

    def step() -> None:
        out.copy_(x * 2 + 1)

    graph = EmulatedGraph()
    graph.capture(step)
    assert out.tolist() == [3.0, 5.0]
    x.copy_(torch.tensor([10.0, 20.0]))
    graph.replay()
    assert out.tolist() == [21.0, 41.0]
    new_x = torch.tensor([7.0, 7.0])  # a new input, not copied into x: the graph still reads x
    assert new_x is not x
    graph.replay()
    assert out.tolist() == [21.0, 41.0]


@pytest.mark.parametrize(
    "host_read",
    [
        lambda t: t.sum().item(),
        lambda t: int(t[0]),
        lambda t: bool(t.any()),
        lambda t: t.tolist(),
        lambda t: t.nonzero(),
        lambda t: t[t > 1],  # a boolean mask
        lambda t: t.repeat_interleave(t.long()),
        lambda t: t.cpu(),
    ],
    ids=["item", "int", "bool", "tolist", "nonzero", "mask", "repeat_interleave", "cpu"],
)
def test_the_capture_refuses_every_kind_of_host_read(host_read) -> None:
    x = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(GraphContractError, match="capturing a CUDA graph"):
        EmulatedGraph().capture(lambda: host_read(x))


def test_a_replay_refuses_a_tensor_the_capture_never_read() -> None:
    state = {"weight": torch.ones(3)}
    out = torch.zeros(3)

    def step() -> None:
        out.copy_(state["weight"] * 2)

    graph = EmulatedGraph()
    graph.capture(step)
    state["weight"] = torch.full((3,), 5.0)  # replaced, not copied into the old tensor
    with pytest.raises(GraphContractError, match=r"reads a \(3,\) float32 tensor"):
        graph.replay()
    state["weight"] = torch.ones(3)
    with pytest.raises(GraphContractError):
        graph.replay()


def test_the_model_never_waits_for_the_device() -> None:
    """Every forward pass of the model (prefill of whole prompts, prefill after a cached
    prefix, chunks of a long prompt, decode) runs under the emulation's watch without a host
    read: the torch backend's metadata is made on the host before the pass."""
    watched = []
    with make_llm(graphs=None, max_extend_tokens=8) as llm:
        model = llm.engine.model
        forward = model.forward

        def watched_forward() -> torch.Tensor:
            with _Watch("a forward pass"):
                watched.append(1)
                return forward()

        model.forward = watched_forward  # type: ignore[method-assign]
        prompts = build_prompts(MODEL)
        params = SamplingParams(temperature=0.0, max_tokens=4)
        first = llm.generate(prompts, params)
        again = llm.generate(prompts, params)  # the prompts' prefixes are cached now
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again]
    assert len(watched) > 10


# ------------------------------------------------------------------------ FlashInfer's
def test_flashinfers_graph_wrapper_plans_into_its_buffers() -> None:
    import flashinfer

    workspace = torch.empty(1024, dtype=torch.uint8)
    indptr, indices, last = torch.zeros(3, dtype=torch.int32), torch.zeros(16, dtype=torch.int32), \
        torch.ones(2, dtype=torch.int32)  # fmt: skip
    wrapper = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        workspace, indptr_buffer=indptr, indices_buffer=indices, last_page_len_buffer=last
    )
    k_cache = v_cache = torch.randn(16, 1, 2, 8)
    q = torch.randn(2, 4, 8)
    with pytest.raises(RuntimeError, match="before plan"):
        wrapper.run(q, (k_cache, v_cache))
    plan = dict(num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=1,
                q_data_type=torch.float32)  # fmt: skip
    ones = torch.ones(2, dtype=torch.int32)
    wrapper.plan(torch.tensor([0, 3, 5], dtype=torch.int32),
                 torch.tensor([4, 5, 6, 9, 10], dtype=torch.int32), ones, **plan)  # fmt: skip
    assert indptr.tolist() == [0, 3, 5] and indices[:5].tolist() == [4, 5, 6, 9, 10]
    first = wrapper.run(q, (k_cache, v_cache))
    indices[:5] = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)  # the buffers are what runs
    assert not torch.allclose(wrapper.run(q, (k_cache, v_cache)), first)
    with pytest.raises(ValueError, match="batch size should be fixed"):
        wrapper.plan(torch.tensor([0, 3], dtype=torch.int32),
                     torch.tensor([4, 5, 6], dtype=torch.int32), ones[:1], **plan)  # fmt: skip
