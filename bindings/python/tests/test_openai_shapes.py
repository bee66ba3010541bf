"""The OpenAI-shaped results validate against the ``openai`` package's own (pydantic)
types, streamed or not, with log-probabilities and usage."""

from __future__ import annotations

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

MSGS = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_chat_completion(model):
    d = model.create_chat_completion(MSGS, max_tokens=12, temperature=0)
    c = ChatCompletion.model_validate(d)
    assert c.object == "chat.completion"
    assert c.model == model.name
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == model.chat(MSGS, max_tokens=12, temperature=0)
    assert c.choices[0].finish_reason in ("stop", "length")
    assert c.usage.prompt_tokens == len(model.chat_prompt(MSGS))
    assert c.usage.completion_tokens <= 12
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    assert c.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_completion_n_and_logprobs(model):
    d = model.create_chat_completion(MSGS, max_tokens=6, temperature=0.8, seed=7, n=2,
                                     logprobs=True, top_logprobs=3)
    c = ChatCompletion.model_validate(d)
    assert [ch.index for ch in c.choices] == [0, 1]
    for ch in c.choices:
        entries = ch.logprobs.content
        assert len(entries) >= 1 and all(len(e.top_logprobs) == 3 for e in entries)
        assert all(e.logprob <= 0 for e in entries)


def test_chat_completion_stream(model):
    chunks = list(model.create_chat_completion(MSGS, max_tokens=12, temperature=0,
                                               stream=True,
                                               stream_options={"include_usage": True}))
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    text = "".join(p.choices[0].delta.content or "" for p in parsed if p.choices)
    assert text == model.chat(MSGS, max_tokens=12, temperature=0)
    finals = [p.choices[0].finish_reason for p in parsed if p.choices and p.choices[0].finish_reason]
    assert len(finals) == 1
    assert parsed[-1].usage is not None and parsed[-1].choices == []
    assert len({p.id for p in parsed}) == 1


def test_completion_and_stream(model):
    d = model.create_completion("The capital of France is", max_tokens=8, temperature=0,
                                logprobs=2, echo=True)
    c = Completion.model_validate(d)
    assert c.object == "text_completion"
    assert c.choices[0].text.startswith("The capital of France is Paris")
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    chunks = list(model.create_completion("The capital of France is", max_tokens=8,
                                          temperature=0, stream=True))
    # The SDK's `Completion` type requires a finish reason, but streams (OpenAI's too) send
    # null before the last chunk: validate each chunk's shape with the null filled in.
    assert all(x["choices"][0]["finish_reason"] is None for x in chunks[:-1])
    parsed = [Completion.model_validate({**x, "choices": [
        {**ch, "finish_reason": ch["finish_reason"] or "stop"} for ch in x["choices"]]})
        for x in chunks]
    assert "".join(p.choices[0].text for p in parsed) == c.choices[0].text[len(
        "The capital of France is"):]
    assert parsed[-1].choices[0].finish_reason == "length"
    # llama-cpp-python's call shortcut.
    plain = model("The capital of France is", max_tokens=8, temperature=0)
    assert plain["choices"][0]["text"] == c.choices[0].text[len("The capital of France is"):]


def test_structured_output(model):
    import json

    d = model.create_chat_completion(MSGS, max_tokens=40, temperature=0,
                                     response_format={"type": "json_object"})
    c = ChatCompletion.model_validate(d)
    assert isinstance(json.loads(c.choices[0].message.content), dict)
