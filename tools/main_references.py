"""transformers' answers to the prompts the chapters' mains check, stored in the references
cache (tools/parity.py) ahead of the first `python tools/steps.py check`.

    python tools/main_references.py [MODEL ...]     # default: every parity model

`python tools/models.py` runs it after building the models. Most of these prompts are asked by
a main and by no test: without this, a fresh clone's first check computes their answers inside
the mains (about 80 s of one core, most of it SmolLM2). It is a script of its own, not part of
tools/models.py, because tools/deps.py counts every example file that a module names as a
dependency of the tests that import that module, and no test runs this.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.models import MOE_PARITY_MODELS, PARITY_MODELS  # noqa: E402
from tools.parity import Case, _case_references, build_prompts, load_example, run_parity  # noqa: E402

# A main named here makes its cases with that function, for each model it checks.
MAIN_CASES = {
    "examples/ch11_overlap.py": "mixed_cases",
    "examples/ch16_tp.py": "cases_for",
    "examples/ch21_benchmarks.py": "shared_prefix_cases",
}
# These mains ask for the default prompts (tools/parity.py's DEFAULT_TEXTS), NEW_TOKENS each,
# and the mains of chapters 0 to 10 for run_parity's default number of tokens.
MAIN_LENGTHS = ["examples/ch19_kernels.py", "examples/ch20_moe.py", "examples/p1_performance.py"]


def main_cases(name: str) -> List[Case]:
    """Every case that a chapter's main checks `name` on, each once."""
    lengths = {inspect.signature(run_parity).parameters["max_new_tokens"].default}
    lengths |= {load_example(main).NEW_TOKENS for main in MAIN_LENGTHS}
    cases = [Case("default", p, n) for n in sorted(lengths) for p in build_prompts(name)]
    if name in PARITY_MODELS:  # the MoE model is checked by the mains of MAIN_LENGTHS only
        for main, function in MAIN_CASES.items():
            cases += getattr(load_example(main), function)(name)
    distinct = {(tuple(c.prompt), c.max_new_tokens): c for c in cases}  # ch16's are defaults
    return list(distinct.values())


def cache_main_references(names: List[str]) -> None:
    """transformers' answers to every main's parity cases (`main_cases`), into the references
    cache."""
    for name in [n for n in names if n in MOE_PARITY_MODELS]:
        cases = main_cases(name)
        _case_references(name, cases)
        print(f"{name:14s} transformers' answers to the mains' {len(cases)} prompts: cached")


if __name__ == "__main__":
    cache_main_references(sys.argv[1:] or MOE_PARITY_MODELS)
