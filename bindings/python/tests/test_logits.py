"""``Model.logits`` is the engine's: bit for bit the facade's ``Session::logits`` (through
the ``logits`` example program, a separate process), and what the engine samples from
(its greedy token and reported log-probabilities)."""

from __future__ import annotations

import subprocess

import numpy as np


def reference(logits_bin, model_path, ids, all=False):
    args = [str(logits_bin), str(model_path), ",".join(map(str, ids))]
    if all:
        args.append("--all")
    out = subprocess.run(args, check=True, capture_output=True).stdout
    return np.frombuffer(out, dtype="<f4")


def test_last_position_bit_for_bit(model, smol_path, logits_bin):
    ids = model.tokenize("The capital of France is")
    got = model.logits(ids)
    assert got.dtype == np.float32 and got.shape == (model.n_vocab,)
    ref = reference(logits_bin, smol_path, ids)
    assert ref.shape == got.shape
    assert got.tobytes() == ref.tobytes()
    # Evaluated from an empty cache each time: the same numbers again.
    assert model.logits(ids).tobytes() == got.tobytes()


def test_all_positions_bit_for_bit(model, smol_path, logits_bin):
    ids = model.tokenize("def fibonacci(n):")
    got = model.logits(ids, all=True)
    assert got.shape == (len(ids), model.n_vocab)
    ref = reference(logits_bin, smol_path, ids, all=True).reshape(len(ids), model.n_vocab)
    assert got.tobytes() == ref.tobytes()
    # The last row is the next token's logits.
    assert got[-1].tobytes() == model.logits(ids).tobytes()


def test_logits_are_what_the_engine_samples_from(model):
    prompt = "The capital of France is"
    logits = model.logits(prompt)
    out = model.create_completion(prompt, max_tokens=1, temperature=0, logprobs=5)
    lp = out["choices"][0]["logprobs"]
    # The greedy token is the arg-max of the logits.
    assert lp["tokens"][0] == model.token_bytes(int(np.argmax(logits))).decode()
    # The reported log-probabilities are the log-softmax of these logits.
    x = logits.astype(np.float64)
    log_softmax = x - x.max() - np.log(np.exp(x - x.max()).sum())
    top = sorted(range(len(x)), key=lambda i: -x[i])[:5]
    reported = list(lp["top_logprobs"][0].values())
    np.testing.assert_allclose(reported, log_softmax[top], atol=1e-5)
