"""Chapter 03: the model's full-sequence forward pass against transformers.

Retired at chapter 04, where attention starts to read and write the KV pool: from then on a
forward pass needs a pool and a page table (chapter 04's tests) and, from chapter 05, an
attention backend (chapter 05's tests compare the same logits through it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.core import Batch, Context, clear_global_ctx, set_global_ctx
from minisgl.layers import set_rope_device
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils import cached_load_hf_config
from tools.models import PARITY_MODELS


@pytest.fixture()
def context():
    clear_global_ctx()
    ctx = Context(page_size=1)
    set_global_ctx(ctx)
    yield ctx
    clear_global_ctx()


def build(path: Path):
    config = ModelConfig.from_hf(cached_load_hf_config(str(path)))
    set_rope_device(torch.device("cpu"))
    with torch.device("meta"):
        model = create_model(config)
    model.load_state_dict(dict(load_weight(str(path), torch.device("cpu"))))
    return config, model


def run(ctx: Context, model, sequences):
    batch = Batch(reqs=[], phase="prefill")
    batch.input_ids = torch.tensor([t for s in sequences for t in s])
    batch.positions = torch.cat([torch.arange(len(s)) for s in sequences])
    with torch.inference_mode(), ctx.forward_batch(batch):
        return model.forward()


@pytest.mark.parametrize("name", PARITY_MODELS)
def test_full_sequence_logits_match_transformers(name: str, model_path, context) -> None:
    _, model = build(model_path(name))
    hf = AutoModelForCausalLM.from_pretrained(model_path(name), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 49152, (29,), generator=g).tolist()
    ours = run(context, model, [prompt])
    with torch.inference_mode():
        theirs = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_sequences_side_by_side_do_not_see_each_other(model_path, context) -> None:
    _, model = build(model_path("tiny-qwen3"))
    a, b = [5, 60, 700, 8000], [11, 12, 13, 14, 15, 16, 17]
    together = run(context, model, [a, b])
    torch.testing.assert_close(together[:4], run(context, model, [a]), atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(together[4:], run(context, model, [b]), atol=5e-5, rtol=1e-4)


def test_no_cache_generation_matches_step0(model_path) -> None:
    from tests.support import load_example

    ch03, step0 = load_example("examples/ch03_model.py"), load_example("examples/ch00_step0.py")
    clear_global_ctx()
    set_global_ctx(Context(page_size=1))
    try:
        prompts = [[9, 120, 3001], [77, 15, 16, 17, 18]]
        ours = ch03.generate("tiny-llama3", prompts, 10)
    finally:
        clear_global_ctx()
    model = step0.Step0Model(model_path("tiny-llama3"))
    assert ours == [model.generate(p, 10) for p in prompts]
