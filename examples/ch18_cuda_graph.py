"""Chapter 18: CUDA graphs.

The decode step is captured once per batch size and replayed: a decode batch is padded with a
dummy request up to the next captured size, its inputs are copied into the graph's buffers,
the attention backend refreshes its own buffers, and one call replays hundreds of kernels.

On the CPU the graphs are emulated (minisgl/utils/cpu_graph.py): they save nothing there, but
they keep a graph's rules. This main shows the padding, then four mistakes and what each one
gives (a refusal, or wrong tokens as on a GPU), then generates with graphs on every backend
and compares every token with transformers, counting the replays so that the graphs are seen
to run. On a GPU the graphs are real; there it also compares, in bfloat16 with FlashInfer,
the tokens of the graphs with those of the eager engine.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple
from unittest.mock import patch

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LOG_LEVEL", "WARNING")
from examples.helpers.gpu_libraries import use_standins  # noqa: E402
from minisgl.attention.native import TorchNativeBackend  # noqa: E402
from minisgl.core import Batch, SamplingParams, clear_global_ctx  # noqa: E402
from minisgl.distributed import reset_tp_info  # noqa: E402
from minisgl.engine.graph import GraphCaptureBuffer  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.utils.cpu_graph import GraphContractError  # noqa: E402
from tools.models import PARITY_MODELS, TINY_MODELS, ensure_model  # noqa: E402
from tools.parity import (  # noqa: E402
    Case,
    book_device,
    book_dtype,
    build_prompts,
    eos_ids,
    run_parity_cases,  # noqa: E402
)

GRAPH_SIZES = [1, 2, 4]  # three prompts: a decode batch of 3 runs as the graph of 4
NEW_TOKENS = 32
DEMO_MODEL = "tiny-qwen3"


def make_llm(name: str, backend: str = "torch", graphs: List[int] | None = GRAPH_SIZES) -> LLM:
    settings = dict(cuda_graph_bs=graphs) if graphs else dict(cuda_graph_max_bs=0)
    return LLM(
        str(ensure_model(name)), dtype=book_dtype(), attention_backend=backend, page_size=4,
        num_page_override=256, max_running_req=8, **settings,
    )  # fmt: skip


def backends() -> List[str]:
    """Every backend with float32 kernels here (the GPU libraries have none on a GPU)."""
    return ["torch", "fi", "fa"] if book_device() == "cpu" else ["torch"]


def parity_backends() -> List[str]:
    """The parity check's: the torch backend and FlashInfer's, whose graphs differ most (fixed
    buffers of its own, a graph wrapper per size); tests/test_ch18_cuda_graph.py holds every
    backend's graphs to the eager engine's tokens."""
    return [b for b in backends() if b in ("torch", "fi")]


def generate(llm: LLM, prompts: List[List[int]], n: int = NEW_TOKENS) -> List[List[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [o["token_ids"] for o in llm.generate(prompts, params)]


def differences(ours: List[List[int]], right: List[List[int]]) -> str:
    wrong = [(i, s) for i, (a, b) in enumerate(zip(ours, right)) for s, (x, y) in
             enumerate(zip(a, b)) if x != y]  # fmt: skip
    total = sum(len(r) for r in right)
    if not wrong:
        return f"0 of {total} tokens differ"
    prompt, step = wrong[0]
    return f"{len(wrong)} of {total} tokens differ, the first at token {step} of prompt {prompt}"


# ------------------------------------------------------------------------------- padding
def show_padding() -> None:
    with make_llm(DEMO_MODEL) as llm:
        runner = llm.engine.graph_runner
        where = "emulated on the CPU" if book_device() == "cpu" else "CUDA graphs"
        print(f"captured batch sizes: {runner.graph_bs_list} ({where})")
        print("decode batch  runs as")
        for size in range(1, max(GRAPH_SIZES) + 2):
            batch = Batch(reqs=[runner.dummy_req] * size, phase="decode")
            runner.pad_batch(batch)
            if not runner.can_use_cuda_graph(batch):
                how = "eagerly (larger than the largest graph)"
            else:
                pad = batch.padded_size - size
                how = f"the graph of {batch.padded_size}" + (f" (+{pad} dummy)" if pad else "")
            print(f"{size:12d}  {how}")


# ------------------------------------------------------------------------------- mistakes
def host_read_in_the_step() -> str:
    """The torch backend made to read a length on the host in every layer."""
    if book_device() != "cpu":  # CUDA refuses it itself, and may leave its context unusable
        return "refused at capture by CUDA (not tried here: the rest of this main needs CUDA)"
    original = TorchNativeBackend.forward

    def reads_a_length(self, q, k, v, layer_id, batch):  # type: ignore[no-untyped-def]
        int(batch.attn_metadata.kv_valid.sum(dim=1).max())  # the longest request, as an int
        return original(self, q, k, v, layer_id, batch)

    with patch.object(TorchNativeBackend, "forward", reads_a_length):
        try:
            make_llm(DEMO_MODEL).shutdown()
        except GraphContractError as e:
            clear_global_ctx()  # the engine stopped half-built
            reset_tp_info()
            return f"refused at capture: {str(e).splitlines()[0]}"
    return "NOT REFUSED"


def positions_not_copied(prompts: List[List[int]], right: List[List[int]]) -> str:
    def copy_from(self: GraphCaptureBuffer, batch: Batch) -> None:
        rows = slice(batch.padded_size)
        self.input_ids[rows].copy_(batch.input_ids)
        self.out_loc[rows].copy_(batch.out_loc)  # positions forgotten

    with patch.object(GraphCaptureBuffer, "copy_from", copy_from), make_llm(DEMO_MODEL) as llm:
        return differences(generate(llm, prompts), right)


def metadata_not_copied(backend: str, prompts: List[List[int]]) -> str:
    with make_llm(DEMO_MODEL, backend) as llm:
        right = generate(llm, prompts)
        attention = llm.engine.attn_backend
        with patch.object(attention, "prepare_for_replay", lambda batch: None):
            return differences(generate(llm, prompts), right)


def weights_replaced(prompts: List[List[int]]) -> str:
    """New weights loaded into the model after the capture, as new tensors."""
    with make_llm(DEMO_MODEL) as llm:
        generate(llm, prompts, 4)
        model = llm.engine.model
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        try:
            llm.engine.graph_runner.graph_map[1].replay()
        except GraphContractError as e:
            return f"refused at replay: {e}"
        if book_device() != "cpu":
            return "replayed, silently, with the old weights (a real graph holds addresses)"
    return "NOT REFUSED"


def show_mistakes() -> bool:
    prompts = build_prompts(DEMO_MODEL)
    with make_llm(DEMO_MODEL) as llm:
        right = generate(llm, prompts)
    results = [
        ("a host read in the step (int() of a tensor)", host_read_in_the_step()),
        ("positions not copied into their buffer", positions_not_copied(prompts, right)),
        *[
            (f"{b}: the attention metadata not copied", metadata_not_copied(b, prompts))
            for b in backends()
        ],
        ("new weights loaded after the capture", weights_replaced(prompts)),
    ]
    for what, result in results:
        print(f"- {what}:")
        print(textwrap.fill(result, width=92, initial_indent="    ", subsequent_indent="    "))

    def caught(result: str) -> bool:
        wrong = " tokens differ" in result and not result.startswith("0 of")
        return result.startswith(("refused", "replayed, silently")) or wrong

    return all(caught(result) for _, result in results)


# ------------------------------------------------------------------------------- parity
REPLAYS: List[Tuple[int, int]] = []  # (graph replays, eager decode steps) of each run


def generate_with_graphs(name: str, cases: List[Case], run: int = 0) -> List[List[int]]:
    with make_llm(name, parity_backends()[run]) as llm:
        runner, counts = llm.engine.graph_runner, [0, 0]
        forward = llm.engine.forward_batch

        def counting(batch, args):  # type: ignore[no-untyped-def]
            if batch.is_decode:
                counts[0 if runner.can_use_cuda_graph(batch) else 1] += 1
            return forward(batch, args)

        llm.engine.forward_batch = counting  # type: ignore[method-assign]
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        outputs = llm.generate([c.prompt for c in cases], params)
        REPLAYS.append((counts[0], counts[1]))
    eos = eos_ids(name)[:1]  # LLM.generate leaves out the EOS that ended a request
    return [o["token_ids"] + (eos if len(o["token_ids"]) < NEW_TOKENS else []) for o in outputs]


def graphs_equal_eager_in_bfloat16() -> bool:
    """On a GPU with FlashInfer: the tokens of the graphs against the eager engine's."""
    os.environ["MINISGL_BOOK_DTYPE"] = "bfloat16"
    ok = True
    print(f"{'model':14s} {'tokens':>6s} {'equal':>5s}")
    for name in [m for m in PARITY_MODELS if m in TINY_MODELS]:
        prompts = build_prompts(name)
        runs = []
        for graphs in (None, GRAPH_SIZES):
            with make_llm(name, "fi", graphs) as llm:
                runs.append(generate(llm, prompts))
        total = sum(len(r) for r in runs[0])
        equal = sum(a == b for x, y in zip(*runs) for a, b in zip(x, y))
        ok &= equal == total
        print(f"{name:14s} {total:6d} {equal:5d}")
    return ok


def main() -> int:
    use_standins()  # FlashInfer's and sgl-kernel's stand-ins where they are not installed
    print("== padding a decode batch to a captured size")
    show_padding()
    print("\n== four kinds of mistake, on tiny-qwen3's three prompts (32 greedy tokens each)")
    caught = show_mistakes()
    names = ", ".join(parity_backends())
    print(f"\n== float32, graphs of {GRAPH_SIZES}, every token against transformers: {names}")
    summary = run_parity_cases(
        generate_with_graphs,
        lambda name: [
            Case(f"prompt {i}", p, NEW_TOKENS) for i, p in enumerate(build_prompts(name))
        ],
        runs=len(parity_backends()),
        run_label=("backend", lambda name, run: parity_backends()[run]),
    )
    replays, eager = map(sum, zip(*REPLAYS))
    print(f"decode steps: {replays} graph replays, {eager} eager")
    ok = summary.ok and caught and replays > 0
    if torch.cuda.is_available() and not use_standins()["flashinfer"]:
        print("\n== bfloat16 on the GPU, FlashInfer: graphs against the eager engine")
        ok &= graphs_equal_eager_in_bfloat16()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
