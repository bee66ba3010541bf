"""KV cache types through the Python package: ``mica.Model(..., cache_type_k=, cache_type_v=)``
takes llama.cpp's names; a q8_0/q4_0 cache generates (its tokens are held to llama.cpp's by
the Rust golden test), and an unknown type raises ``mica.InvalidParameter`` naming it."""

from __future__ import annotations

import pytest

import mica

from conftest import THREADS


def test_quantized_cache_generates(smol_path):
    m = mica.Model(smol_path, n_ctx=256, n_threads=THREADS, cache_type_k="q8_0", cache_type_v="q4_0")
    text = m.generate("The capital of France is", max_tokens=8, temperature=0)
    assert text.strip(), text


def test_unknown_cache_type_is_an_invalid_parameter(smol_path):
    with pytest.raises(mica.InvalidParameter) as e:
        mica.Model(smol_path, n_ctx=256, n_threads=THREADS, cache_type_v="q3_k")
    assert "unknown cache type 'q3_k'" in str(e.value)
    assert e.value.param == "cache_type_v"
