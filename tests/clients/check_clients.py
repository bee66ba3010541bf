#!/usr/bin/env python3
"""Real-client checks of `mica serve` (run: tests/clients/run.sh): the `openai` SDK (models
list and retrieve, chat, completions, streaming, logprobs, errors, embeddings) and the `ollama` client
(generate, chat, streaming, list, show, embed) against a server on 127.0.0.1 that requires the API
key given as the third argument. Exits non-zero on the first failure and prints
'N passed, 0 failed' at the end."""

import ollama
import openai

from common import args, check, done, ollama_client, openai_client

url, model, key = args()

oa = openai_client(url, key)
models = [m.id for m in oa.models.list()]
check("openai models.list", model in models, models)
m = oa.models.retrieve(model)
check("openai models.retrieve", m.id == model and m.object == "model", m)
try:
    oa.models.retrieve("no-such-model")
    check("openai models.retrieve unknown raises", False)
except openai.NotFoundError as e:
    check("openai models.retrieve unknown -> NotFoundError", e.status_code == 404, e)
try:
    openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").models.list()
    check("openai wrong key raises", False)
except openai.AuthenticationError as e:
    check("openai wrong key -> AuthenticationError", e.status_code == 401, e)

r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                               max_tokens=8, temperature=0)
check("openai chat", r.choices[0].message.content and r.usage.completion_tokens == 8, r)

parts = []
usage = None
for ch in oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                     max_tokens=8, temperature=0, stream=True,
                                     stream_options={"include_usage": True}):
    if ch.choices and ch.choices[0].delta.content:
        parts.append(ch.choices[0].delta.content)
    if ch.usage:
        usage = ch.usage
check("openai chat stream = non-stream", "".join(parts) == r.choices[0].message.content,
      ("".join(parts), r.choices[0].message.content))
check("openai stream usage", usage is not None and usage.completion_tokens == 8, usage)

c = oa.completions.create(model=model, prompt="The capital of France is", max_tokens=5,
                          temperature=0, logprobs=3)
check("openai completions + logprobs",
      len(c.choices[0].logprobs.token_logprobs) == 5 and len(c.choices[0].logprobs.top_logprobs[0]) == 3, c)

r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                               temperature=0, logprobs=True, top_logprobs=2)
check("openai chat logprobs", len(r.choices[0].logprobs.content) == 2, r)

try:
    oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check("openai unknown model raises", False)
except openai.NotFoundError as e:
    check("openai unknown model -> NotFoundError", e.status_code == 404)
try:
    oa.completions.create(model=model, prompt="word " * 5000, max_tokens=1)
    check("openai oversize raises", False)
except openai.BadRequestError as e:
    check("openai oversize prompt -> BadRequestError", "tokens" in str(e), str(e))

# Embeddings: the SDK asks for base64 by default and decodes it; float gives the same vector.
e = oa.embeddings.create(model=model, input=["The cat sat.", "A dog ran."])
v0 = e.data[0].embedding
check("openai embeddings.create", len(e.data) == 2 and len(v0) == 576 and e.usage.prompt_tokens > 0,
      e.usage)
check("openai embedding normalized", abs(sum(x * x for x in v0) - 1.0) < 1e-4)
f = oa.embeddings.create(model=model, input="The cat sat.", encoding_format="float")
check("openai embedding float = base64", max(abs(a - b) for a, b in zip(f.data[0].embedding, v0)) < 1e-6)
try:
    oa.embeddings.create(model=model, input="x", dimensions=8)
    check("openai embeddings dimensions raises", False)
except openai.BadRequestError as e:
    check("openai embeddings dimensions -> BadRequestError", "dimensions" in str(e), str(e))

try:
    ollama.Client(host=url).list()
    check("ollama without key raises", False)
except ollama.ResponseError as e:
    check("ollama without key -> 401", e.status_code == 401, e)
ol = ollama_client(url, key)
names = [m.model for m in ol.list().models]
check("ollama list", model in names, names)
g = ol.generate(model=model, prompt="Why is the sky blue?", options={"num_predict": 6, "temperature": 0})
check("ollama generate", g.done and g.eval_count == 6, g)
chunks = list(ol.generate(model=model, prompt="Why is the sky blue?", stream=True,
                          options={"num_predict": 6, "temperature": 0}))
check("ollama generate stream", chunks[-1].done and "".join(c.response for c in chunks) == g.response,
      chunks)
m = ol.chat(model=model, messages=[{"role": "user", "content": "Hello!"}], options={"num_predict": 5})
check("ollama chat", m.message.role == "assistant" and m.message.content, m)
chunks = list(ol.chat(model=model, messages=[{"role": "user", "content": "Hello!"}], stream=True,
                      options={"num_predict": 5}))
check("ollama chat stream", chunks[-1].done, chunks[-1])
check("ollama show", ol.show(model).modelinfo["general.architecture"] == "llama")
emb = ol.embed(model=model, input=["The cat sat.", "A dog ran."])
check("ollama embed", len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 576, emb)
check("ollama embed = openai", max(abs(a - b) for a, b in zip(emb.embeddings[0], v0)) < 1e-6)
old = ol.embeddings(model=model, prompt="The cat sat.")
check("ollama embeddings (older route)", len(old.embedding) == 576)
try:
    ol.generate(model="no-such-model", prompt="x")
    check("ollama unknown model raises", False)
except ollama.ResponseError as e:
    check("ollama unknown model -> ResponseError 404", e.status_code == 404, e)

done()
