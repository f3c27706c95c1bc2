"""Chapter 16: tensor parallelism. Ranks are real processes with a gloo process group: the
collectives, each split layer against the whole one, generation against transformers through
scheduler ranks and through the server, sizes that cannot split a model, and a rank that dies."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import tempfile
import time
import urllib.request
from datetime import timedelta
from typing import Dict, List

import pytest
import torch

from tests.support import left_out

MODELS = {"tiny-qwen3": 2}  # tiny Mistral's copied key/value head: the layer test and the main
RANK_TIMEOUT_S = 120.0


def _join(rank: int, size: int, store: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=size,
        timeout=timedelta(seconds=60),
    )  # fmt: skip


# --------------------------------------------------------------------- the collectives
def _collectives(rank: int, size: int, store: str, out: mp.Queue) -> None:
    import torch.distributed as dist

    from minisgl.distributed import DistributedCommunicator

    _join(rank, size, store)
    comm = DistributedCommunicator()
    summed = comm.all_reduce(torch.full((2, 3), float(rank + 1)))
    gathered = comm.all_gather(torch.arange(4.0).view(2, 2) + 10 * rank)
    out.put((rank, summed.tolist(), gathered.tolist()))
    dist.destroy_process_group()


def run_ranks(target, size: int, *args: object) -> List[object]:
    """Run `target(rank, size, store, out, *args)` in `size` processes; what each put on out,
    by rank."""
    from minisgl.utils import worker_context
    from tools.processes import finish, receive, stopped_on_exit

    # the fork server of this pytest process starts with its first worker, and imports then
    # what the first call names: name here what every rank of this file needs (the scheduler
    # brings the layers and the engine; transformers' auto classes come with every fork
    # server), or each rank imports it again
    ctx = worker_context([__name__, "minisgl.scheduler", "examples.helpers.scheduler_process"])
    out: mp.Queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="minisgl-test-ranks-") as folder:
        store = os.path.join(folder, "store")  # gloo's rendezvous file, gone with the folder
        processes = [
            ctx.Process(target=target, args=(rank, size, store, out, *args), name=f"rank {rank}")
            for rank in range(size)
        ]
        with stopped_on_exit(*processes):
            for p in processes:
                p.start()
            results = [
                receive(out, processes, RANK_TIMEOUT_S, "a rank's result") for _ in processes
            ]
            finish(processes)
    return [r for r in sorted(results, key=lambda r: r[0])]  # type: ignore[index]


@pytest.mark.parametrize("size", [2, 3])
def test_the_communicator_adds_up_and_gathers_on_every_rank(size: int) -> None:
    results = run_ranks(_collectives, size)
    total = float(sum(range(1, size + 1)))
    gathered = torch.cat([torch.arange(4.0).view(2, 2) + 10 * r for r in range(size)]).tolist()
    for rank, summed, got in results:  # type: ignore[misc]
        assert summed == [[total] * 3] * 2, rank
        assert got == gathered, rank


# ------------------------------------------------------ each split layer, against the whole
HIDDEN, HEAD_DIM, HEADS, KV_HEADS, MLP, VOCAB = 64, 16, 4, 2, 96, 50  # 50: not a multiple of 4


def _whole_weights() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return {
        "model.embed_tokens.weight": r(VOCAB, HIDDEN),
        "lm_head.weight": r(VOCAB, HIDDEN),
        "q_proj.weight": r(HEADS * HEAD_DIM, HIDDEN),
        "k_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
        "v_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
        "o_proj.weight": r(HIDDEN, HEADS * HEAD_DIM),
        "gate_proj.weight": r(MLP, HIDDEN),
        "up_proj.weight": r(MLP, HIDDEN),
        "down_proj.weight": r(HIDDEN, MLP),
    }


def _split_layers(rank: int, size: int, store: str, out: mp.Queue) -> None:
    """Each layer of this rank, fed the same input as the whole layer: the rank's part of the
    output (column-split layers) or the whole output (row-split layers, embedding, LM head)."""
    import torch.distributed as dist

    from minisgl.distributed import DistributedInfo, reset_tp_info, set_tp_info
    from minisgl.layers import (
        LinearColParallelMerged,
        LinearOProj,
        LinearQKVMerged,
        LinearRowParallel,
        ParallelLMHead,
        VocabParallelEmbedding,
    )
    from minisgl.models.weight import _shard_tensor

    _join(rank, size, store)
    set_tp_info(rank, size)
    w = _whole_weights()
    tp = DistributedInfo(rank, size)
    part = {k: _shard_tensor(f"model.layers.0.self_attn.{k}", v, tp, KV_HEADS)
            for k, v in w.items() if "_proj" in k}  # fmt: skip
    part["embed"] = _shard_tensor("model.embed_tokens.weight", w["model.embed_tokens.weight"],
                                  tp, KV_HEADS)  # fmt: skip
    part["head"] = _shard_tensor("lm_head.weight", w["lm_head.weight"], tp, KV_HEADS)
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1))
    results = {}

    qkv = LinearQKVMerged(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, has_bias=False)
    qkv.weight = torch.cat([part["q_proj.weight"], part["k_proj.weight"], part["v_proj.weight"]])
    results["qkv"] = qkv.forward(x)
    up = LinearColParallelMerged(HIDDEN, [MLP, MLP], has_bias=False)
    up.weight = torch.cat([part["gate_proj.weight"], part["up_proj.weight"]])
    results["gate_up"] = up.forward(x)
    o = LinearOProj(HEADS * HEAD_DIM, HIDDEN, has_bias=False)
    o.weight = part["o_proj.weight"]
    heads = torch.randn(5, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(2))
    per_rank = HEADS * HEAD_DIM // size
    results["o"] = o.forward(heads[:, rank * per_rank : (rank + 1) * per_rank].contiguous())
    down = LinearRowParallel(MLP, HIDDEN, has_bias=False)
    down.weight = part["down_proj.weight"]
    mlp = torch.randn(5, MLP, generator=torch.Generator().manual_seed(3))
    per_rank = MLP // size
    results["down"] = down.forward(mlp[:, rank * per_rank : (rank + 1) * per_rank].contiguous())
    embed = VocabParallelEmbedding(VOCAB, HIDDEN)
    embed.weight = part["embed"]
    results["embed"] = embed.forward(torch.tensor([0, 13, 26, 49, 37]))
    head = ParallelLMHead(VOCAB, HIDDEN)
    head.weight = part["head"]
    results["head"] = head.forward(x)
    reset_tp_info()
    out.put((rank, {k: v.tolist() for k, v in results.items()}))
    dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 4])
def test_each_split_layer_equals_the_whole_one(size: int) -> None:
    w = _whole_weights()
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1))
    heads = torch.randn(5, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(2))
    mlp = torch.randn(5, MLP, generator=torch.Generator().manual_seed(3))
    whole = {
        "q": x @ w["q_proj.weight"].T,
        "k": x @ w["k_proj.weight"].T,
        "v": x @ w["v_proj.weight"].T,
        "gate": x @ w["gate_proj.weight"].T,
        "up": x @ w["up_proj.weight"].T,
        "o": heads @ w["o_proj.weight"].T,
        "down": mlp @ w["down_proj.weight"].T,
        "embed": w["model.embed_tokens.weight"][[0, 13, 26, 49, 37]],
        "head": x @ w["lm_head.weight"].T,
    }
    q_part, mlp_part = HEADS * HEAD_DIM // size, MLP // size
    kv_heads_here = max(1, KV_HEADS // size)
    for rank, got in run_ranks(_split_layers, size):  # type: ignore[misc]
        got = {k: torch.tensor(v) for k, v in got.items()}
        kv_head = rank * KV_HEADS // size  # the first key/value head this rank holds
        kv_cols = slice(kv_head * HEAD_DIM, (kv_head + kv_heads_here) * HEAD_DIM)
        expected_qkv = torch.cat(
            [
                whole["q"][:, rank * q_part : (rank + 1) * q_part],
                whole["k"][:, kv_cols],
                whole["v"][:, kv_cols],
            ],
            dim=1,
        )
        expected_gate_up = torch.cat(
            [
                whole["gate"][:, rank * mlp_part : (rank + 1) * mlp_part],
                whole["up"][:, rank * mlp_part : (rank + 1) * mlp_part],
            ],
            dim=1,
        )
        torch.testing.assert_close(got["qkv"], expected_qkv)
        torch.testing.assert_close(got["gate_up"], expected_gate_up)
        for name in ("o", "down", "embed", "head"):  # whole on every rank
            torch.testing.assert_close(got[name], whole[name], msg=f"{name} on rank {rank}")


# ------------------------------------------------------------ generation, against transformers
def _config(name: str, size: int, **overrides: object):
    from minisgl.distributed import DistributedInfo
    from minisgl.scheduler import SchedulerConfig
    from tools.models import ensure_model

    return SchedulerConfig(
        model_path=str(ensure_model(name)), tp_info=DistributedInfo(0, size),
        dtype=torch.float32, max_running_req=4, page_size=4, num_page_override=128,
        **overrides,
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ranks_generate_transformers_tokens(name: str, model_path) -> None:
    from examples.helpers.ranks import Ranks
    from tools.parity import build_prompts, hf_references

    model_path(name)
    prompts = build_prompts(name)
    refs = hf_references(name, prompts, 12, "cpu", torch.float32)
    with Ranks(_config(name, MODELS[name])) as ranks:
        got = ranks.generate(prompts, 12)
    assert got == [r.tokens for r in refs]


def test_a_dead_rank_fails_the_others_at_once() -> None:
    """Rank 1 is killed while both wait for a request. Rank 0 takes the request, and its next
    collective fails at once: it exits with an error instead of waiting for ever."""
    from examples.helpers.ranks import Ranks
    from minisgl.core import SamplingParams
    from minisgl.message import UserMsg

    ranks = Ranks(_config("tiny-qwen3", 2, distributed_timeout=20.0))
    both_died = r"rank 0 of 2 \(pid \d+\) exited with code 1; rank 1 .* code -9"
    with pytest.raises(RuntimeError, match=both_died):  # what the block's end finds
        with ranks:
            os.kill(ranks.processes[1].pid, signal.SIGKILL)  # type: ignore[arg-type]
            began = time.monotonic()
            prompt = torch.tensor([1, 2, 3], dtype=torch.int32)
            ranks.requests.put(UserMsg(0, prompt, SamplingParams(max_tokens=4)))
            ranks.processes[0].join(60)
            took = time.monotonic() - began
    assert took < 10, f"rank 0 took {took:.0f} s to notice"


def test_sizes_that_cannot_split_a_model_are_refused(capsys) -> None:
    from minisgl.server.args import parse_args
    from tools.models import SMOLLM2, ensure_model

    cases = [("tiny-qwen2", "4", "2 attention heads do not split into 4")]
    if not left_out(SMOLLM2):
        cases.append((SMOLLM2, "2", "9 attention heads do not split into 2"))
    for name, size, why in cases:
        with pytest.raises(SystemExit):
            parse_args(["--model", str(ensure_model(name)), "--tp-size", size])
        assert why in capsys.readouterr().err
    args, _ = parse_args(["--model", str(ensure_model("tiny-mistral")), "--tp-size", "4"])
    assert args.tp_info.size == 4


# --------------------------------------------------------------------------- the server
def test_a_server_of_two_ranks_answers_like_transformers() -> None:
    from examples.helpers.server_process import ServerProcess
    from tools.models import ensure_model
    from tools.parity import hf_references, load_tokenizer

    folder = ensure_model("tiny-qwen3")
    tok = load_tokenizer("tiny-qwen3")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False).input_ids  # as the tokenizer worker does
    expected = tok.decode(hf_references("tiny-qwen3", [prompt], 12, "cpu", torch.float32)[0].tokens)
    with ServerProcess(folder, "--tp-size", "2", "--num-pages", "256") as server:
        request = urllib.request.Request(
            f"{server.url}/v1/chat/completions",
            data=json.dumps({"messages": messages, "max_tokens": 12, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
    assert answer["choices"][0]["message"]["content"] == expected.removesuffix(tok.eos_token or "")
    assert answer["usage"] == {
        "prompt_tokens": len(prompt), "completion_tokens": 12, "total_tokens": len(prompt) + 12
    }  # fmt: skip
