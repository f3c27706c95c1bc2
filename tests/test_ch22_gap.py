"""Chapter 22: the page's map of where each missing feature would go. Every place it names
must exist in the package, and the FP8 arithmetic must be the configs' own."""

from __future__ import annotations

import pytest

from tools.parity import load_example


@pytest.fixture(scope="module")
def gap():
    return load_example("examples/ch22_gap.py")


def test_every_plug_point_exists_in_the_package(gap) -> None:
    names = [name for _, names in gap.PLUG_POINTS for name in names]
    assert len(gap.PLUG_POINTS) == 9 and len(names) >= 40
    for name in names:
        obj, path, line = gap.resolve(name)
        assert obj is not None and path.startswith("minisgl/") and line >= 1, name


def test_a_name_that_is_gone_is_an_error(gap) -> None:
    with pytest.raises(AttributeError):
        gap.resolve("scheduler.scheduler.Scheduler.no_such_method")
    with pytest.raises(ModuleNotFoundError):
        gap.resolve("no_such_module.thing")


def test_the_kv_bytes_per_token_are_the_configs_own(gap) -> None:
    from transformers import Qwen3Config

    from minisgl.models import ModelConfig

    hf = Qwen3Config(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                     head_dim=128, hidden_size=1024)  # fmt: skip
    config = ModelConfig.from_hf(hf)
    assert gap.kv_bytes_per_token(config, 2) == 2 * 28 * 8 * 128 * 2 == 114_688
    assert gap.kv_bytes_per_token(config, 1) == 57_344
