#!/usr/bin/env python3
"""llama-perplexity's computation (tools/perplexity/perplexity.cpp, `perplexity()`) through
llama-cpp-python, to compare with `mica perplexity` on the same model and text.

Non-overlapping windows of CTX tokens over the text tokenized once (BOS added when the model
adds it; special-token text left as text); each window starts from an empty cache with its
first token replaced by BOS when the model adds BOS; logits at positions CTX/2 .. CTX-2 score
the next token; PPL = exp(mean NLL), uncertainty as llama-perplexity prints it.

Also quantizes: `--quantize SRC.gguf OUT.gguf TYPE` runs llama.cpp's own
`llama_model_quantize` (TYPE one of q8_0, q6_k, q5_k_m, q4_k_m, q4_0, f16, ...).

With cache types (`CTK CTV`, llama.cpp's names: f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) the
KV cache holds those types and flash attention is on (llama.cpp requires it for a quantized V
cache), as `llama-perplexity -ctk CTK -ctv CTV -fa on` runs.

Usage: bench/.venv/bin/python bench/llama_cpp_perplexity.py MODEL.gguf TEXT CTX [THREADS [CTK CTV]]
"""
import math
import sys

import numpy as np


def quantize(src, out, ty):
    import llama_cpp
    ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ty.upper())
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize failed: {rc}")


# ggml type ids of llama.cpp's cache types.
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "iq4_nl": 20, "bf16": 30}


def perplexity(model, text_path, n_ctx, threads, cache=None):
    from llama_cpp import Llama
    extra = {}
    if cache:
        extra = dict(flash_attn=True, type_k=GGML_TYPES[cache[0]], type_v=GGML_TYPES[cache[1]])
    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False, **extra)
    text = open(text_path, encoding="utf-8").read()
    tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else False
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    for i in range(n_chunk):
        window = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if add_bos:
            window[0] = bos
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[:n_ctx], dtype=np.float32)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            mx = row.max()
            lse = math.log(np.exp(row - mx, dtype=np.float32).astype(np.float64).sum())
            v = -(float(row[tokens[i * n_ctx + j + 1]] - mx) - lse)
            nll += v
            nll2 += v * v
            count += 1
        print(f"[{i + 1}]{math.exp(nll / count):.4f}", end=",", flush=True, file=sys.stderr)
    print(file=sys.stderr)
    nll /= count
    nll2 = nll2 / count - nll * nll
    ppl = math.exp(nll)
    err = math.sqrt(nll2 / (count - 1)) * ppl if nll2 > 0 else 0.0
    print(f"llama.cpp: {len(tokens)} tokens, {n_chunk} windows of {n_ctx}, BOS {add_bos}")
    print(f"PPL = {ppl:.4f} ± {err:.5f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--quantize":
        quantize(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        perplexity(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                   int(sys.argv[4]) if len(sys.argv) > 4 else 2,
                   (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else None)
