"""Generation through the package equals the ``mica`` binary's greedy output on the golden
prompts (the prompts llama.cpp's reference outputs were taken on), token for token."""

from __future__ import annotations

import json
import subprocess

import pytest

import mica
from conftest import THREADS


def cli_run(mica_bin, model_path, case, n):
    """``mica run --json`` greedy on a golden case (``--chat`` for a conversation)."""
    args = [str(mica_bin), "run", "-m", str(model_path), "--temp", "0", "-n", str(n),
            "-t", str(THREADS), "--json"]
    if "messages" in case:
        msgs = case["messages"]
        system = [m["content"] for m in msgs if m["role"] == "system"]
        user = [m["content"] for m in msgs if m["role"] == "user"]
        assert len(user) == 1 and len(msgs) == len(system) + 1
        args += ["--chat", "-p", user[0]]
        if system:
            args += ["--system", system[0]]
    else:
        args += ["-p", case["prompt"]]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def native_ids(model, ids, n):
    """Greedy token ids of the engine (the ids behind ``generate``'s text)."""
    events = model._native.submit(ids, max_tokens=n, temperature=0.0)
    return mica._openai.gather(events, 1).tokens[0]


def prompt_ids(model, case):
    if "messages" in case:
        return model.chat_prompt(case["messages"])
    return model.tokenize(case["prompt"])


@pytest.mark.parametrize("case_id", ["capital", "story", "code", "unicode", "chat"])
def test_generate_equals_cli_greedy(model, smol_path, mica_bin, golden, case_id):
    case = next(c for c in golden["cases"] if c["id"] == case_id)
    n = 24
    ids = prompt_ids(model, case)
    # The prompt tokenizes (or the chat renders) to llama.cpp's ids.
    assert ids == case["prompt_ids"]
    ref = cli_run(mica_bin, smol_path, case, n)
    assert ref["prompt_ids"] == ids
    assert native_ids(model, ids, n) == ref["output_ids"]
    if "messages" in case:
        text = model.chat(case["messages"], max_tokens=n, temperature=0)
    else:
        text = model.generate(case["prompt"], max_tokens=n, temperature=0)
    assert text == ref["text"]


def test_generate_from_ids_and_text_agree(model):
    ids = model.tokenize("The capital of France is")
    assert model.generate(ids, max_tokens=8, temperature=0) == model.generate(
        "The capital of France is", max_tokens=8, temperature=0
    )


def test_seeded_sampling_is_reproducible(model):
    kw = dict(max_tokens=16, temperature=0.9, seed=1234)
    a = model.generate("Once upon a time", **kw)
    b = model.generate("Once upon a time", **kw)
    assert a == b
    others = {model.generate("Once upon a time", **{**kw, "seed": s}) for s in range(4)}
    assert len(others) > 1, "different seeds never changed the sample"


def test_stop_string_and_max_tokens(model):
    full = model.generate("The capital of France is", max_tokens=16, temperature=0)
    assert full.startswith(" Paris")
    cut = model.generate("The capital of France is", max_tokens=16, temperature=0, stop="Paris")
    assert cut == full[: full.index("Paris")]
    one = model.create_completion("The capital of France is", max_tokens=1, temperature=0)
    assert one["usage"]["completion_tokens"] == 1
    assert one["choices"][0]["finish_reason"] == "length"


def test_tokenize_detokenize_round_trip(model):
    text = "Café au lait — naïve façade; 東京 🚀"
    ids = model.tokenize(text, add_special=False)
    assert model.detokenize(ids) == text
    assert model.tokenize(text.encode("utf-8"), add_special=False) == ids
    special = model.tokenize("<|im_start|>user", add_special=False)
    assert len(special) == 2 and model.detokenize(special[:1]) == "<|im_start|>"
    assert model.tokenize("<|im_start|>", add_special=False, parse_special=False) != special[:1]


def test_typical_xtc_and_dry_keywords(model):
    loop = "I like apples. I like apples. I like apples. I like apples. I like"
    plain = model.generate(loop, max_tokens=16, temperature=0)
    assert plain.count("apples") >= 3, plain
    dry = model.generate(loop, max_tokens=16, temperature=0, dry_multiplier=0.8)
    assert "I like apples" not in dry, dry
    # A short window cannot see the sentence again: greedy output as without DRY.
    assert model.generate(loop, max_tokens=16, temperature=0, dry_multiplier=0.8,
                          dry_penalty_last_n=3, dry_sequence_breakers="\n") == plain
    kw = dict(max_tokens=16, temperature=1.0, seed=7)
    base = model.generate("Once upon a time", **kw)
    for extra in (dict(typical_p=0.2), dict(xtc_probability=1.0, xtc_threshold=0.05)):
        a = model.generate("Once upon a time", **kw, **extra)
        assert a == model.generate("Once upon a time", **kw, **extra)
        assert a != base, extra
    # The OpenAI-shaped methods take typical_p too (as llama-cpp-python's).
    d = model.create_completion("Once upon a time", typical_p=0.2, **kw)
    assert d["choices"][0]["text"] == model.generate("Once upon a time", typical_p=0.2, **kw)
    with pytest.raises(mica.InvalidParameter):
        model.generate("x", max_tokens=1, dry_base=0.5)
