"""Chapter 00: the step-0 engine, piece by piece and whole, against transformers."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from tests.conftest import tiny_model_names
from tests.support import TREE_ROOT, load_example

step0 = load_example("examples/ch00_step0.py")


@pytest.mark.parametrize("size", [1, 7, 64, 576])
def test_rms_norm_matches_transformers(size: int) -> None:
    torch.manual_seed(size)
    x = torch.randn(5, size) * 3
    hf = LlamaRMSNorm(size, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(size))
        expected = hf(x)
    torch.testing.assert_close(step0.rms_norm(x, hf.weight.detach(), 1e-6), expected)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
    ids=["default", "llama3"],
)
def test_rope_matches_transformers(rope: dict) -> None:
    head_dim, heads, n = 64, 3, 11
    config = LlamaConfig(
        hidden_size=head_dim * heads,
        num_attention_heads=heads,
        head_dim=head_dim,
        rope_parameters=rope,
    )
    positions = torch.arange(100, 100 + n)
    q, k = torch.randn(1, heads, n, head_dim), torch.randn(1, heads, n, head_dim)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)

    inv_freq = step0.rope_inv_freq(config.to_dict(), head_dim)
    angles = torch.outer(positions.float(), inv_freq)[:, None, :]
    ours_q = step0.apply_rope(q[0].transpose(0, 1), angles.cos(), angles.sin())
    ours_k = step0.apply_rope(k[0].transpose(0, 1), angles.cos(), angles.sin())
    torch.testing.assert_close(ours_q, q_hf[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours_k, k_hf[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


@pytest.mark.parametrize("name", tiny_model_names())
def test_full_forward_matches_transformers_logits(name: str, model_path) -> None:
    folder = model_path(name)
    model = step0.Step0Model(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = _prompt(37, seed=1)
    model.generate(prompt, 1)  # allocates the cache
    with torch.inference_mode():
        ours = model.forward(torch.tensor(prompt), 0)
        theirs = hf(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama3"])
def test_cached_decode_equals_recomputation(name: str, model_path) -> None:
    """Decoding one token at a time through the KV cache gives the logits that a full
    forward over the whole sequence gives."""
    model = step0.Step0Model(model_path(name))
    prompt = _prompt(9, seed=2)
    generated = model.generate(prompt, 6)
    full = prompt + generated[:-1]
    with torch.inference_mode():
        # the cache now holds the whole sequence; the last step's logits from the cache ...
        cached = model.forward(torch.tensor(full[-1:]), len(full) - 1)
        # ... must equal a fresh forward of every token
        model.generate(full, 1)
        fresh = model.forward(torch.tensor(full), 0)
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)
    assert int(fresh.argmax()) == generated[-1]


def test_generate_matches_transformers(model_path, capsys) -> None:
    matched, total, margin = step0.check("tiny-qwen2", ["Hello there", "One two three"], n=12)
    out = capsys.readouterr().out
    assert total == 24 and matched == total, out
    assert margin > 0


def test_a_broken_attention_line_is_caught(tmp_path, capsys) -> None:
    """A reader who breaks one line of attention (here: drops the causal mask) sees the check
    fail and name the first diverging token."""
    source = (TREE_ROOT / "examples" / "ch00_step0.py").read_text()
    line = 'probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)'
    assert source.count(line) == 1
    broken_file = tmp_path / "examples" / "ch00_broken.py"
    broken_file.parent.mkdir()
    broken_file.write_text(source.replace(line, "probs = scores.softmax(dim=-1)"))
    spec = importlib.util.spec_from_file_location("ch00_broken", broken_file)
    broken = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(TREE_ROOT))
    spec.loader.exec_module(broken)
    matched, total, _ = broken.check("tiny-llama3", ["The capital of France is", "Hi"], n=8)
    out = capsys.readouterr().out
    assert total == 16 and matched < total, out
    assert "first divergence at generated token" in out
    page = TREE_ROOT / "docs" / "chapters" / "ch00-step0.md"
    if page.exists():  # at the repository root: the chapter shows this very output
        shown = page.read_text().split("<!-- broken-attention -->\n```text\n")[1].split("```")[0]
        strip_speed = lambda text: [
            re.sub(r"\s+[\d.]+$", "", line) for line in text.strip().splitlines()
        ]
        assert strip_speed(shown) == strip_speed(out)


def test_config_loading_accepts_both_rope_formats(model_path) -> None:
    """transformers 5 writes rope_parameters; older configs have rope_theta + rope_scaling."""
    config = json.loads((model_path("tiny-llama3") / "config.json").read_text())
    new = step0.rope_inv_freq(config, 128)
    old_style = {k: v for k, v in config.items() if k != "rope_parameters"}
    params = dict(config["rope_parameters"])
    old_style["rope_theta"] = params.pop("rope_theta")
    old_style["rope_scaling"] = params
    torch.testing.assert_close(step0.rope_inv_freq(old_style, 128), new)
