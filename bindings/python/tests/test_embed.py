"""Model.embed against llama.cpp's embeddings of the same model (the fixture the facade's
embedding test uses, made by fixtures/embeddings/llama_cpp_ref.py): same pooling (last
token, what SmolLM2 gets since it declares none), cosine >= 0.9999; shapes and errors."""

import json
import pathlib

import numpy as np
import mica

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_embeddings_match_llama_cpp(model):
    ref = json.loads((REPO / "fixtures/embeddings/smollm2-135m-instruct-q4_1.json").read_text())
    got = model.embed(ref["texts"])
    assert got.dtype == np.float32 and got.shape == (len(ref["texts"]), len(ref["last"][0]))
    for row, want in zip(got, ref["last"]):
        want = np.asarray(want, dtype=np.float64)
        cos = float(np.dot(row, want) / (np.linalg.norm(row) * np.linalg.norm(want)))
        assert cos >= 0.9999, cos
        assert abs(float(np.linalg.norm(row)) - 1.0) < 1e-5


def test_embed_one_string_and_unnormalized(model):
    one = model.embed("The capital of France is Paris.")
    raw = model.embed(["The capital of France is Paris."], normalize=False)
    assert one.shape == raw.shape and one.shape[0] == 1
    assert np.allclose(raw[0] / np.linalg.norm(raw[0]), one[0], atol=1e-6)

