"""Chapter 20: mixture of experts. The router and the experts against transformers' own
modules, the fused backend's layout and kernels against the loop over the experts, and the
checkpoint's experts stacked as the layer holds them.

On a CPU the Triton kernels run in Triton's interpreter; on a GPU they are compiled.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.moe import SUPPORTED_MOE_BACKENDS, create_moe_backend  # noqa: E402
from minisgl.moe.fused import FusedMoe, moe_align_block_size  # noqa: E402
from minisgl.moe.native import TorchMoe, select_experts  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def hf_moe_block(experts: int = 8, top_k: int = 2, renormalize: bool = True, seed: int = 0):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=experts,
                            num_experts_per_tok=top_k, norm_topk_prob=renormalize)  # fmt: skip
    torch.manual_seed(seed)
    block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
    return block


@pytest.mark.parametrize("renormalize", [True, False])
def test_the_router_chooses_what_transformers_chooses(renormalize):
    block = hf_moe_block(renormalize=renormalize)
    x = torch.randn(29, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, hf_weights, hf_ids = block.gate(x)
    weights, ids = select_experts(logits, 2, renormalize)
    assert torch.equal(ids, hf_ids)
    assert torch.equal(weights, hf_weights.float())


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens", [1, 3, 29])
def test_the_torch_backend_computes_what_transformers_computes(renormalize, tokens):
    block = hf_moe_block(renormalize=renormalize)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        expected = block(x[None])[0]
        logits = torch.nn.functional.linear(x, block.gate.weight)
        ours = TorchMoe().forward(x, block.experts.gate_up_proj, block.experts.down_proj,
                                  logits, 2, renormalize)  # fmt: skip
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)  # the order of sums differs


@pytest.mark.parametrize(
    "tokens,top_k,experts,block", [(1, 2, 8, 16), (13, 2, 8, 4), (40, 3, 5, 16)]
)
def test_the_alignment_gives_each_block_one_expert_and_every_pair_once(
    tokens, top_k, experts, block
):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    sorted_ids, expert_ids, used = moe_align_block_size(ids, block, experts)
    pairs = ids.numel()
    counts = torch.bincount(ids.flatten(), minlength=experts)
    assert used.item() == int(((counts + block - 1) // block * block).sum())
    assert sorted_ids.shape[0] == pairs + experts * (block - 1)  # fixed by the shapes only
    real = sorted_ids[sorted_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # every pair once
    assert (sorted_ids[used.item() :] == pairs).all()  # nothing in use after the padding
    flat = ids.flatten()
    for b in range(used.item() // block):
        rows = sorted_ids[b * block : (b + 1) * block]
        rows = rows[rows < pairs].long()
        assert (flat[rows] == expert_ids[b]).all()  # one expert per block
        assert torch.equal(rows, rows.sort().values)  # in arrival order within an expert


@pytest.mark.parametrize("tokens", [1, 6, 37])
@pytest.mark.parametrize("renormalize", [True, False])
def test_the_fused_backend_computes_what_the_loop_computes(tokens, renormalize):
    g = torch.Generator().manual_seed(tokens)
    dtype = torch.float32
    x = torch.randn(tokens, 64, generator=g).to(DEVICE, dtype)
    w1 = (torch.randn(8, 2 * 48, 64, generator=g) * 0.1).to(DEVICE, dtype)  # 48: not a tile size
    w2 = (torch.randn(8, 64, 48, generator=g) * 0.1).to(DEVICE, dtype)
    logits = torch.randn(tokens, 8, generator=g).to(DEVICE, dtype)
    args = (x, w1, w2, logits, 2, renormalize)
    torch.testing.assert_close(FusedMoe().forward(*args), TorchMoe().forward(*args),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


@pytest.mark.skipif(DEVICE != "cuda", reason="bfloat16 matrix products need a GPU")
def test_the_fused_backend_in_bfloat16_on_a_gpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 256, generator=g).cuda().bfloat16()
    w1 = (torch.randn(8, 256, 256, generator=g) * 0.05).cuda().bfloat16()
    w2 = (torch.randn(8, 256, 128, generator=g) * 0.05).cuda().bfloat16()
    logits = torch.randn(300, 8, generator=g).cuda().bfloat16()
    args = (x, w1, w2, logits, 2, True)
    expected = TorchMoe().forward(*[a.float() if torch.is_tensor(a) else a for a in args])
    torch.testing.assert_close(FusedMoe().forward(*args).float(), expected, rtol=3e-2, atol=3e-2)


def test_the_experts_are_stacked_as_the_layer_holds_them(model_path):
    from transformers import AutoModelForCausalLM

    from minisgl.models import load_weight

    folder = model_path("tiny-qwen3-moe")
    ours = dict(load_weight(str(folder), torch.device("cpu")))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    experts = hf.model.layers[1].mlp.experts
    assert torch.equal(ours["model.layers.1.mlp.experts.gate_up_proj"], experts.gate_up_proj)
    assert torch.equal(ours["model.layers.1.mlp.experts.down_proj"], experts.down_proj)
    assert torch.equal(ours["model.layers.1.mlp.gate.weight"], hf.model.layers[1].mlp.gate.weight)
    assert not any(".experts.0." in key for key in ours)


def test_the_backends_are_registered_and_picked_by_device():
    assert {"torch", "fused"} <= set(SUPPORTED_MOE_BACKENDS.supported_names())
    assert isinstance(create_moe_backend("torch"), TorchMoe)
    from minisgl.server.args import build_parser

    args = build_parser().parse_args(["--model", "m", "--moe-backend", "fused"])
    assert args.moe_backend == "fused"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--moe-backend", "nope"])


def test_the_engine_runs_the_moe_model_with_the_auto_backend(model_path):
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    with LLM(str(model_path("tiny-qwen3-moe")), dtype=torch.float32, page_size=4,
             num_page_override=64, max_running_req=4, cuda_graph_max_bs=0) as llm:  # fmt: skip
        expected = FusedMoe if llm.engine.device.type == "cuda" else TorchMoe
        assert isinstance(llm.engine.moe_backend, expected)
        out = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=5))
    assert len(out[0]["token_ids"]) == 5
