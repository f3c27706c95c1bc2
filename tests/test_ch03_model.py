"""Chapter 03: configs, the model classes, and the streaming weight loader."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, LlamaConfig

from minisgl.layers import set_rope_device
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.models.weight import _get_merge_info
from minisgl.utils import cached_load_hf_config, download_hf_weight, load_tokenizer
from tests.conftest import tiny_model_names
from tools.models import PARITY_MODELS, SMOLLM2


def build(path: Path):
    config = ModelConfig.from_hf(cached_load_hf_config(str(path)))
    set_rope_device(torch.device("cpu"))
    with torch.device("meta"):
        model = create_model(config)
    model.load_state_dict(dict(load_weight(str(path), torch.device("cpu"))))
    return config, model


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_model_config_reads_the_hf_config(name: str, model_path) -> None:
    hf = AutoConfig.from_pretrained(model_path(name))
    config = ModelConfig.from_hf(hf)
    assert config.num_layers == hf.num_hidden_layers
    assert (config.num_qo_heads, config.num_kv_heads) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
    )
    assert config.head_dim == (
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    )
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.rotary_config.base == hf.rope_parameters["rope_theta"]
    assert config.architectures == hf.architectures and not config.is_moe
    if name == "tiny-llama3":
        assert config.rotary_config.scaling == {
            k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"
        }
    else:
        assert config.rotary_config.scaling is None


def test_model_config_reads_the_older_rope_style() -> None:
    """transformers 4 configs keep rope_theta apart and may say "type" for "rope_type"."""
    hf = LlamaConfig(head_dim=64)
    hf.rope_parameters = None
    hf.rope_theta = 500000.0
    hf.rope_scaling = {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    rotary = ModelConfig.from_hf(hf).rotary_config
    assert rotary.base == 500000.0 and rotary.scaling is not None
    assert rotary.scaling["rope_type"] == "llama3" and "type" not in rotary.scaling


def test_unknown_architecture_is_refused_clearly() -> None:
    hf = LlamaConfig(head_dim=64)
    hf.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*not supported"):
        create_model(ModelConfig.from_hf(hf))


@pytest.mark.parametrize("name", tiny_model_names())
def test_state_dict_names_are_exactly_the_loaded_names(name: str, model_path) -> None:
    config, model = build(model_path(name))
    loaded = dict(load_weight(str(model_path(name)), torch.device("cpu")))
    assert set(model.state_dict()) == set(loaded)
    layer0 = model.model.layers.op_list[0]
    assert (
        layer0.self_attn.qkv_proj.weight.shape[0]
        == (config.num_qo_heads + 2 * config.num_kv_heads) * config.head_dim
    )
    assert (layer0.self_attn.qkv_proj.bias is not None) == (name == "tiny-qwen2")
    assert (layer0.self_attn.q_norm is not None) == (name == "tiny-qwen3")


def test_merging_concatenates_in_q_k_v_order(tmp_path: Path) -> None:
    tensors = {
        f"model.layers.0.self_attn.{x}_proj.weight": torch.full((2, 3), float(i))
        for i, x in enumerate("vqk")
    }
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, tmp_path / "model.safetensors")
    loaded = dict(load_weight(str(tmp_path), torch.device("cpu")))
    qkv = loaded["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv[:, 0].tolist() == [1, 1, 2, 2, 0, 0]  # q (1), k (2), v (0), whatever the file order
    assert set(loaded) == {"model.layers.0.self_attn.qkv_proj.weight", "model.norm.weight"}
    assert _get_merge_info("model.layers.3.mlp.up_proj.weight") == (
        "model.layers.3.mlp.gate_up_proj.weight",
        "up",
        ("gate", "up"),
    )
    assert _get_merge_info("model.layers.3.self_attn.o_proj.weight") is None


def test_an_incomplete_merge_group_is_an_error(tmp_path: Path) -> None:
    save_file(
        {"model.layers.0.mlp.gate_proj.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors"
    )
    with pytest.raises(ValueError, match="incomplete merge groups.*gate_up_proj"):
        list(load_weight(str(tmp_path), torch.device("cpu")))


def test_the_loader_never_holds_the_whole_checkpoint(model_path) -> None:
    """Stream SmolLM2 (over 500 MiB) and watch the process's anonymous memory at every tensor:
    it must stay far below the checkpoint's size."""
    folder = model_path(SMOLLM2)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    script = textwrap.dedent(
        f"""
        import json, torch
        from minisgl.models import load_weight

        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024

        base, peak, largest, count = anon(), 0, 0, 0
        for name, tensor in load_weight({str(folder)!r}, torch.device("cpu")):
            peak = max(peak, anon() - base)
            largest = max(largest, tensor.numel() * tensor.element_size())
            count += 1
            del tensor
        print(json.dumps({{"peak": peak, "largest": largest, "count": count}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["count"] == 182
    assert result["peak"] < 0.4 * size, (result, size)
    assert result["peak"] < 3 * result["largest"], result


def test_the_loader_yields_each_tensor_as_soon_as_it_can(model_path, monkeypatch) -> None:
    """Count the tensors read from the files and the tensors yielded: at every yield, at most
    the pieces of the current merge groups are waiting (a loader that read everything first
    would have 272 tensors waiting at its first yield)."""
    import safetensors

    import minisgl.models.weight as weight

    reads = []
    real_safe_open = safetensors.safe_open

    class CountingFile:
        def __init__(self, *args, **kwargs) -> None:
            self._file = real_safe_open(*args, **kwargs)

        def __enter__(self):
            self._inner = self._file.__enter__()
            return self

        def __exit__(self, *exc):
            return self._file.__exit__(*exc)

        def keys(self):
            return self._inner.keys()

        def get_tensor(self, name):
            reads.append(name)
            return self._inner.get_tensor(name)

    monkeypatch.setattr(weight.safetensors, "safe_open", CountingFile)
    parts = {"qkv_proj": 3, "gate_up_proj": 2}
    accounted, most_waiting = 0, 0
    for name, _ in load_weight(str(model_path(SMOLLM2)), torch.device("cpu")):
        accounted += next((n for key, n in parts.items() if key in name), 1)
        most_waiting = max(most_waiting, len(reads) - accounted)
    assert len(reads) == accounted == 272
    assert most_waiting <= 4, most_waiting


def test_hf_helpers_on_local_folders(model_path, tmp_path: Path, monkeypatch) -> None:
    folder = str(model_path("tiny-qwen3"))
    assert download_hf_weight(folder) == folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="neither a local folder nor a reachable model id"):
        download_hf_weight("no-such-org/no-such-model")
    a, b = cached_load_hf_config(folder), cached_load_hf_config(folder)
    assert a is not b and a.to_dict() == b.to_dict()  # cached, but each caller gets a copy
    # a tokenizer without a chat template picks it up from chat_template.json
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_text((Path(folder) / f).read_text())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.json").write_text(
        json.dumps({"chat_template": "{{ messages[0]['content'] }}!"})
    )
    tok = load_tokenizer(str(tmp_path))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi!"
