"""LoRA adapters through the Python package: ``mica.Model(..., lora=[...])`` applies them
unmerged. A random GGUF LoRA for SmolLM2 is written by ``bench/lora_cost.py``'s writer;
at scale 0 the output is the base model's token for token, at scale 1 it differs, and an
adapter for another model is an error naming it."""

from __future__ import annotations

import importlib.util
import pathlib
import random

import pytest

import mica

from conftest import REPO, THREADS


def _writer():
    spec = importlib.util.spec_from_file_location("lora_cost", REPO / "bench/lora_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, smol_path, mica_bin) -> pathlib.Path:
    lc = _writer()
    arch, targets = lc.shapes(str(mica_bin), str(smol_path))
    assert len(targets) == 7 * 30, targets
    path = tmp_path_factory.mktemp("lora") / "r4.gguf"
    # Large values, so that the adapter certainly changes the greedy text.
    lc.write_lora(str(path), arch, targets, 4, random.Random(3), "f16", std=0.3)
    return path


def _text(model: mica.Model) -> str:
    return model.generate("The capital of France is", max_tokens=16, temperature=0)


def test_adapter_changes_the_output_and_scale_zero_is_the_base(smol_path, adapter, model):
    base = _text(model)
    zero = mica.Model(smol_path, n_threads=THREADS, lora=[(adapter, 0.0)])
    assert _text(zero) == base
    tuned = mica.Model(smol_path, n_threads=THREADS, lora=[adapter])
    assert _text(tuned) != base


def test_an_adapter_for_another_model_is_an_error_naming_it(smol_path):
    other = REPO / "fixtures/lora/llama/adapter-f32.gguf"
    with pytest.raises(mica.MicaError) as e:
        mica.Model(smol_path, n_threads=THREADS, lora=[other])
    assert "shape" in str(e.value) and "lora" in str(e.value).lower()
    with pytest.raises(mica.MicaError) as e:
        mica.Model(smol_path, n_threads=THREADS, lora=["/nonexistent/adapter"])
    assert "no such adapter" in str(e.value)


def test_convert_merges_an_adapter(tmp_path):
    """``mica.convert(..., lora=...)`` writes the merged model (its logits are checked by the
    Rust tests, crates/mica-quant/tests/convert_lora.rs); a folder that is no adapter is an
    error."""
    out = tmp_path / "merged.gguf"
    report = mica.convert(REPO / "fixtures/hf/llama", out, lora=[REPO / "fixtures/lora/llama"])
    assert report["tensors"] > 0 and out.is_file()
    with pytest.raises(mica.MicaError):
        mica.convert(REPO / "fixtures/hf/llama", tmp_path / "x.gguf",
                     lora=[(REPO / "fixtures/hf/qwen3", 1.0)])
