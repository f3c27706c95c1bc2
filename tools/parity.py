"""Token-for-token parity with transformers, shared by the chapters' mains (01 on).

A main hands :func:`run_parity` a function that generates greedily with the chapter's engine;
this module runs transformers' ``generate`` on the same prompts (caching its answers, keyed by
everything that could change them), compares every token, prints one row per prompt and the
summary line that ``tools/steps.py check`` reads:

    parity: models=5 prompts=3 tokens=478/478 min_margin=0.0107

The device and dtype come from ``MINISGL_BOOK_DEVICE`` (default: the GPU if there is one, else
the CPU) and ``MINISGL_BOOK_DTYPE`` (default: float32), so the same mains run on a GPU. Step 0
and the mains that reuse its model (chapters 00-02) always run on the CPU in float32.
Nothing here imports minisgl.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tools.models import PARITY_MODELS, SMOLLM2, cache_dir, ensure_model, file_lock

DEFAULT_TEXTS = ["The capital of France is", "def fibonacci(n):", "Name three primary colours."]
# A generator: (model name, prompts as token ids, max new tokens) -> generated ids per prompt.
Generate = Callable[[str, List[List[int]], int], List[List[int]]]


def load_example(relative_path: str) -> ModuleType:
    """Import an earlier chapter's main (say examples/ch00_step0.py) without running it."""
    path = Path(__file__).resolve().parents[1] / relative_path
    name = f"book_example_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, f"cannot load {path}"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def book_device() -> str:
    """Where the mains run the models: $MINISGL_BOOK_DEVICE, else the GPU when there is one
    (unless MINISGL_DEVICE=cpu, which also keeps the engine on the CPU)."""
    import torch

    if "MINISGL_BOOK_DEVICE" in os.environ:
        return os.environ["MINISGL_BOOK_DEVICE"]
    if os.environ.get("MINISGL_DEVICE") != "cpu" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def book_dtype():
    import torch

    return getattr(torch, os.environ.get("MINISGL_BOOK_DTYPE", "float32"))


@functools.lru_cache(maxsize=None)
def load_tokenizer(name: str):
    """The model's tokenizer, loaded once per process (a load takes about 0.3 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_model(name))


def build_prompts(name: str, texts: Sequence[str] = DEFAULT_TEXTS) -> List[List[int]]:
    """Token ids for `texts`; the last one goes through the model's chat template."""
    tok = load_tokenizer(name)
    chat = [{"role": "user", "content": texts[-1]}]
    chat_text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return [tok(t).input_ids for t in list(texts[:-1]) + [chat_text]]


def eos_ids(name: str) -> List[int]:
    config = json.loads((ensure_model(name) / "generation_config.json").read_text())
    eos = config.get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


@dataclass
class Reference:
    tokens: List[int]
    margins: List[float]  # top-1 minus top-2 logit, per generated token


def _reference_key(name: str, prompt: List[int], n: int, device: str, dtype: str) -> str:
    import torch
    import transformers

    stamp = (ensure_model(name) / "book-model.json").read_text()
    raw = json.dumps([stamp, prompt, n, device, dtype, transformers.__version__, torch.__version__])
    return hashlib.sha256(raw.encode()).hexdigest()


_PARSED: Dict[Path, Tuple[Tuple[int, int], Dict[str, Dict]]] = {}  # file -> (its stat, its data)


def _read_references(store: Path) -> Dict[str, Dict]:
    """The references stored in `store`, parsed once per process while the file is unchanged."""
    if not store.exists():
        return {}
    stat = store.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    if store not in _PARSED or _PARSED[store][0] != stamp:
        _PARSED[store] = (stamp, json.loads(store.read_text()))
    return _PARSED[store][1]


def hf_references(
    name: str, prompts: List[List[int]], n: int, device: str | None = None, dtype=None
) -> List[Reference]:
    """transformers' greedy output for each prompt, computed once and cached on disk. The
    device and dtype default to the book's (book_device, book_dtype)."""
    import torch

    device, dtype = device or book_device(), dtype or book_dtype()
    dtype_name = str(dtype).removeprefix("torch.")
    store = cache_dir() / "references" / f"{name}.json"
    keys = [_reference_key(name, p, n, device, dtype_name) for p in prompts]
    known = _read_references(store)  # replaced whole (os.replace): readers need no lock
    if all(k in known for k in keys):
        return [Reference(known[k]["tokens"], known[k]["margins"]) for k in keys]
    # the lock is for those that compute: a process that only reads never waits for one
    with file_lock(store.with_suffix(".lock")):
        known = _read_references(store)
        missing = [i for i, k in enumerate(keys) if k not in known]
        if missing:
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(ensure_model(name), dtype=dtype).to(device)
            for i in missing:
                with torch.inference_mode():
                    out = hf.generate(
                        torch.tensor([prompts[i]], device=device),
                        attention_mask=torch.ones(
                            1, len(prompts[i]), dtype=torch.long, device=device
                        ),
                        max_new_tokens=n,
                        do_sample=False,
                        output_logits=True,
                        return_dict_in_generate=True,
                    )
                top2 = torch.stack(out.logits)[:, 0].float().topk(2, dim=-1).values
                known[keys[i]] = {
                    "tokens": out.sequences[0, len(prompts[i]) :].tolist(),
                    "margins": (top2[:, 0] - top2[:, 1]).tolist(),
                }
            tmp = store.with_suffix(".tmp")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, store)
    return [Reference(known[k]["tokens"], known[k]["margins"]) for k in keys]


def show_token(tok, tokens: List[int], pos: int) -> str:
    """Token `pos` of `tokens` with its text, or "end" past the last one."""
    return f"{tokens[pos]} {tok.decode([tokens[pos]])!r}" if pos < len(tokens) else "end"


@dataclass
class Comparison:
    matched: int  # tokens equal before the first divergence
    total: int  # tokens transformers generated
    margin: float  # smallest top-2 margin over the compared tokens
    divergence: Optional[int]  # first differing position, None when all equal


def compare(ours: List[int], ref: Reference) -> Comparison:
    pos = next(i for i, (a, b) in enumerate(zip(ours + [-1], ref.tokens + [-2])) if a != b)
    same = ours == ref.tokens
    upto = ref.margins[: pos + 1] or [math.inf]
    return Comparison(pos, len(ref.tokens), min(upto), None if same else pos)


@dataclass
class Summary:
    models: int = 0
    prompts: int = 0
    matched: int = 0
    total: int = 0
    margin: float = math.inf
    failures: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.matched == self.total and self.total > 0

    def line(self) -> str:
        return (
            f"parity: models={self.models} prompts={self.prompts} "
            f"tokens={self.matched}/{self.total} min_margin={self.margin:.4f}"
        )


@dataclass
class Case:
    """One prompt of a parity check: a label to print, its token ids, how many new tokens."""

    label: str
    prompt: List[int]
    max_new_tokens: int


def _case_references(name: str, cases: List[Case]) -> List[Reference]:
    """transformers' output for every case, asked once per length of output (one model load
    for all the missing ones of a length, not one per case)."""
    refs: Dict[int, Reference] = {}
    for n in {c.max_new_tokens for c in cases}:
        positions = [i for i, c in enumerate(cases) if c.max_new_tokens == n]
        refs.update(zip(positions, hf_references(name, [cases[i].prompt for i in positions], n)))
    return [refs[i] for i in range(len(cases))]


def run_parity_cases(
    generate: Callable[[str, List[Case]], List[List[int]]],
    cases_for: Callable[[str], List[Case]],
    models: Sequence[str] = PARITY_MODELS,
    runs: int | Callable[[str], int] = 1,
    run_label: Tuple[str, Callable[[str, int], str]] | None = None,
) -> Summary:
    """Like run_parity, for a workload of any shape: `generate(name, cases)` returns the
    tokens of every case; `runs` (a number, or a function of the model's name) says how many
    times each case is generated (with different engine settings, say), and all runs are
    compared. Prints one row per model and run (`run_label`: the column's heading, and the
    label of run i of a model, instead of the number i); the summary counts each model's
    prompts once and the tokens of every run."""
    summary = Summary(models=len(models))
    runs_of = runs if callable(runs) else (lambda name: runs)
    heading, label = run_label or ("run", lambda name, run: str(run))
    width = max(3, len(heading))
    print(
        f"{'model':14s} {heading:>{width}s} {'prompts':>7s} {'tokens':>7s} {'matched':>7s} "
        f"{'min margin':>10s}"
    )
    for name in models:
        cases = cases_for(name)
        refs = _case_references(name, cases)
        tok = load_tokenizer(name)
        for run in range(runs_of(name)):
            outputs = generate(name, cases) if runs == 1 else generate(name, cases, run)  # type: ignore[call-arg]
            matched = total = 0
            margin = math.inf
            for case, ours, ref in zip(cases, outputs, refs):
                c = compare(list(ours), ref)
                matched, total, margin = matched + c.matched, total + c.total, min(margin, c.margin)
                if c.divergence is not None:
                    summary.failures.append(f"{name} {heading} {label(name, run)} {case.label}")
                    pos = c.divergence
                    mine, theirs = (
                        show_token(tok, list(ours), pos),
                        show_token(tok, ref.tokens, pos),
                    )
                    print(
                        f"  {case.label}: first divergence at generated token {pos}: ours "
                        f"{mine}, transformers {theirs}"
                    )
            summary.matched += matched
            summary.total += total
            summary.margin = min(summary.margin, margin)
            print(
                f"{name:14s} {label(name, run):>{width}s} {len(cases):7d} {total:7d} "
                f"{matched:7d} {margin:10.4f}"
            )
        summary.prompts = max(summary.prompts, len(cases))
    print(summary.line())
    return summary


def run_parity(
    generate: Generate,
    models: Sequence[str] = PARITY_MODELS,
    texts: Sequence[str] = DEFAULT_TEXTS,
    max_new_tokens: int = 32,
    show_text: bool = True,
    device: str | None = None,
    dtype=None,
) -> Summary:
    """Compare `generate` with transformers on every model and prompt; print the results.
    `device` and `dtype` are those of transformers' run (default: the book's); a main whose
    engine always runs on the CPU in float32 passes those."""
    summary = Summary(models=len(models), prompts=len(texts))
    # No tokens per second here: `generate` builds its engine too, so a rate would time that.
    # The benchmarks (tools/bench_offline.py, tools/bench_online.py) time generation alone.
    print(f"{'model':14s} {'prompt':28s} {'tokens':>6s} {'match':>5s} {'margin':>7s}")
    for name in models:
        prompts = build_prompts(name, texts)
        refs = hf_references(name, prompts, max_new_tokens, device, dtype)
        outputs = generate(name, prompts, max_new_tokens)
        tok = load_tokenizer(name)
        for text, ours, ref in zip(texts, outputs, refs):
            c = compare(list(ours), ref)
            summary.matched += c.matched
            summary.total += c.total
            summary.margin = min(summary.margin, c.margin)
            ok = "yes" if c.divergence is None else "NO"
            print(f"{name:14s} {text[:26]!r:28s} {c.total:6d} {ok:>5s} {c.margin:7.4f}")
            if c.divergence is not None:
                summary.failures.append(f"{name} {text!r}")
                pos = c.divergence
                margin = ref.margins[min(pos, len(ref.margins) - 1)] if ref.margins else math.nan
                mine, theirs = show_token(tok, list(ours), pos), show_token(tok, ref.tokens, pos)
                print(
                    f"  first divergence at generated token {pos}: ours {mine}, "
                    f"transformers {theirs}, top-2 margin there {margin:.4f}"
                )
            elif show_text and name == SMOLLM2:
                print(f"  -> {tok.decode(list(ours))!r}")
    print(summary.line())
    return summary
