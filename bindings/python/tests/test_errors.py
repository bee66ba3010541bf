"""Each failure raises its own exception class (all ``mica.MicaError``), chosen from the
library's typed errors."""

from __future__ import annotations

import math

import pytest

import mica


def test_missing_model(tmp_path):
    with pytest.raises(mica.ModelNotFound) as e:
        mica.Model(tmp_path / "nope.gguf", models_dir=tmp_path)
    assert isinstance(e.value, mica.MicaError) and isinstance(e.value, FileNotFoundError)
    assert "nope.gguf" in str(e.value)


def test_corrupt_model(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(mica.ModelError) as e:
        mica.Model(bad)
    assert "bad.gguf" in str(e.value)


@pytest.mark.parametrize(
    "kw,param",
    [
        (dict(temperature=math.nan), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(repeat_penalty=0.0), "repeat_penalty"),
        (dict(logit_bias={10**7: 1.0}), "logit_bias"),
    ],
)
def test_invalid_parameters(model, kw, param):
    with pytest.raises(mica.InvalidParameter) as e:
        model.generate("Hello", max_tokens=4, **kw)
    assert e.value.param == param
    assert isinstance(e.value, ValueError) and isinstance(e.value, mica.MicaError)


def test_invalid_lane_and_unknown_argument(model):
    with pytest.raises(mica.InvalidParameter) as e:
        model.generate("Hello", lane="urgent")
    assert e.value.param == "lane"
    with pytest.raises(TypeError):
        model.generate("Hello", temprature=0)


def test_prompt_too_long(smol_path):
    m = mica.Model(smol_path, n_ctx=32, n_threads=1, kv_mem=16 << 20)
    long_prompt = "word " * 100
    with pytest.raises(mica.PromptTooLong) as e:
        m.generate(long_prompt, max_tokens=4)
    assert isinstance(e.value, ValueError)
    with pytest.raises(mica.PromptTooLong):
        m.logits(long_prompt)


def test_queue_full(smol_path):
    m = mica.Model(smol_path, n_threads=1, kv_mem=16 << 20, max_waiting=0)
    with pytest.raises(mica.QueueFull):
        m.generate("Hello", max_tokens=4)


def test_empty_prompt(model):
    with pytest.raises(mica.InvalidParameter) as e:
        model.generate([], max_tokens=4)
    assert e.value.param == "prompt"


def test_tokenizer_error(model):
    with pytest.raises(mica.TokenizerError):
        model.detokenize([model.n_vocab + 5])


def test_bad_messages(model):
    with pytest.raises(mica.InvalidParameter):
        model.chat([{"content": "no role"}])
    with pytest.raises(mica.InvalidParameter):
        model.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_store_and_hub_errors(tmp_path):
    with pytest.raises(mica.ModelNotFound):
        mica.pull("no-such-model-in-the-catalog", models_dir=tmp_path)
    with pytest.raises(mica.HubError):
        mica.pull("hf:not a valid name", models_dir=tmp_path)


def test_convert_errors(smol_path, tmp_path):
    with pytest.raises(mica.InvalidParameter) as e:
        mica.convert(smol_path, tmp_path / "out.gguf", type="q9_9")
    assert e.value.param == "type"
    with pytest.raises(mica.ConvertError):
        mica.convert(tmp_path / "missing.gguf", tmp_path / "out.gguf")
    with pytest.raises(mica.ConvertError):
        mica.convert(smol_path, tmp_path / "out.gguf", tensor_types=["no-equals-sign"])
