"""Step 0: a whole LLM engine in one file, checked token by token against transformers.

Safetensors in, a hand-written Llama/Mistral/Qwen2/Qwen3 forward pass, a contiguous KV cache,
greedy decoding. Nothing here comes from minisgl."""

import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # find tools/ from anywhere
from tools.models import PARITY_MODELS, SMOLLM2, ensure_model  # noqa: E402


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rope_inv_freq(config: dict, head_dim: int) -> torch.Tensor:
    """One rotation frequency per pair of dimensions, with Llama 3's long-context scaling."""
    rope = config.get("rope_parameters")  # transformers 5; older configs split it in two:
    rope = rope or {**(config.get("rope_scaling") or {}), "rope_theta": config["rope_theta"]}
    inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim)
    if rope.get("rope_type", rope.get("type")) == "llama3":
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (rope["original_max_position_embeddings"] / wavelen - low) / (high - low)
        smooth = smooth.clamp(0, 1)  # 0: long waves, slowed by `factor`; 1: short, unchanged
        inv_freq = inv_freq * ((1 - smooth) / rope["factor"] + smooth)
    return inv_freq


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[i], x[i + d/2]) of every head. x: [n, heads, d], cos/sin: [n, 1, d/2]"""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Step0Model:
    def __init__(self, model_dir: Path) -> None:
        self.config = c = json.loads((model_dir / "config.json").read_text())
        self.w: dict[str, torch.Tensor] = {}  # every weight, by its name in the checkpoint
        for file in sorted(model_dir.glob("*.safetensors")):
            self.w.update(load_file(file))
        self.num_layers, self.num_heads = c["num_hidden_layers"], c["num_attention_heads"]
        self.num_kv_heads = c.get("num_key_value_heads", self.num_heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.num_heads
        self.eps = c["rms_norm_eps"]
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        self.inv_freq = rope_inv_freq(c, self.head_dim)
        self.eos = set(torch.tensor(c["eos_token_id"]).view(-1).tolist())  # one id or a list

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w[f"{name}.weight"], self.w.get(f"{name}.bias"))

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return rms_norm(x, self.w[f"{name}.weight"], self.eps)

    def attention(self, x: torch.Tensor, layer: int, start: int) -> torch.Tensor:
        p, n, d = f"model.layers.{layer}.self_attn.", x.shape[0], self.head_dim
        q = self.linear(x, p + "q_proj").view(n, self.num_heads, d)
        k = self.linear(x, p + "k_proj").view(n, self.num_kv_heads, d)
        v = self.linear(x, p + "v_proj").view(n, self.num_kv_heads, d)
        if p + "q_norm.weight" in self.w:  # Qwen3 normalises every head of q and k
            q, k = self.norm(q, p + "q_norm"), self.norm(k, p + "k_norm")
        positions = torch.arange(start, start + n)
        angles = torch.outer(positions.float(), self.inv_freq)[:, None, :]  # same for all heads
        q, k = apply_rope(q, angles.cos(), angles.sin()), apply_rope(k, angles.cos(), angles.sin())
        self.k_cache[layer][start : start + n], self.v_cache[layer][start : start + n] = k, v
        group = self.num_heads // self.num_kv_heads  # query heads that share one K/V head (GQA)
        keys = self.k_cache[layer][: start + n].repeat_interleave(group, dim=1)
        values = self.v_cache[layer][: start + n].repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(d)
        visible = torch.arange(start + n)[None, :] <= positions[:, None]  # the causal mask
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out = torch.einsum("hqk,khd->qhd", probs, values).reshape(n, self.num_heads * d)
        return self.linear(out, p + "o_proj")

    def mlp(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = f"model.layers.{layer}.mlp."
        gated = F.silu(self.linear(x, p + "gate_proj")) * self.linear(x, p + "up_proj")
        return self.linear(gated, p + "down_proj")

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Run tokens `ids` at positions start, start+1, ...; return the last token's logits."""
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            x = x + self.attention(self.norm(x, p + "input_layernorm"), i, start)
            x = x + self.mlp(self.norm(x, p + "post_attention_layernorm"), i)
        return self.norm(x[-1], "model.norm") @ self.lm_head.T

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        shape = (len(prompt) + max_new_tokens, self.num_kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape) for _ in range(self.num_layers)]
        self.v_cache = [torch.zeros(shape) for _ in range(self.num_layers)]
        ids, start, out = torch.tensor(prompt), 0, []
        while len(out) < max_new_tokens and not (out and out[-1] in self.eos):
            logits = self.forward(ids, start)  # the first call is the prefill, the rest decode
            start += len(ids)
            out.append(int(logits.argmax()))
            ids = torch.tensor(out[-1:])
        return out


def check(name: str, texts: list[str], n: int) -> tuple[int, int, float]:
    """Generate for each prompt with step 0 and with transformers; print a row for each."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = ensure_model(name)
    tok, model = AutoTokenizer.from_pretrained(model_dir), Step0Model(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    chat = [{"role": "user", "content": texts[-1]}]  # the last prompt uses the chat template
    chat_text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompts = [tok(t).input_ids for t in texts[:-1] + [chat_text]]
    matched, total, margins_seen = 0, 0, []
    for text, prompt in zip(texts, prompts):
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        ref, top2 = out.sequences[0, len(prompt) :].tolist(), torch.stack(out.logits)[:, 0].topk(2)
        margins = top2.values[:, 0] - top2.values[:, 1]  # how clear-cut each choice was
        begin = time.perf_counter()
        ours = model.generate(prompt, n)
        speed = len(ours) / (time.perf_counter() - begin)
        good = next(i for i, (a, b) in enumerate(zip(ours + [-1], ref + [-2])) if a != b)
        matched, total = matched + good, total + len(ref)
        margins_seen.append(margin := float(margins[: good + 1].min()))
        ok = "yes" if ours == ref else "NO"
        print(f"{name:14s} {text[:26]!r:28s} {len(ref):6d} {ok:>5s} {margin:7.4f} {speed:7.1f}")
        if ours != ref:
            show = lambda t: f"{t[good]} {tok.decode(t[good])!r}" if good < len(t) else "end"  # noqa
            print(
                f"  first divergence at generated token {good}: ours {show(ours)}, transformers "
                f"{show(ref)}, top-2 margin there {float(margins[min(good, len(margins) - 1)]):.4f}"
            )
        elif name == SMOLLM2:
            print(f"  -> {tok.decode(ours)!r}")
    return matched, total, min(margins_seen)


def main() -> int:
    texts = ["The capital of France is", "def fibonacci(n):", "Name three primary colours."]
    print(f"{'model':14s} {'prompt':28s} {'tokens':>6s} {'match':>5s} {'margin':>7s} {'tok/s':>7s}")
    results = [check(name, texts, n=32) for name in PARITY_MODELS]
    matched, total = sum(r[0] for r in results), sum(r[1] for r in results)
    print(
        f"parity: models={len(results)} prompts={len(texts)} tokens={matched}/{total} "
        f"min_margin={min(r[2] for r in results):.4f}"
    )
    return 0 if matched == total else 1


if __name__ == "__main__":
    sys.exit(main())
