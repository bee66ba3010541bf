#!/usr/bin/env python3
"""Times llama.cpp (through llama-cpp-python) the way `mica run --json` reports itself:
load time, prompt tokens/s, generation tokens/s, for one prompt, greedy.

Usage: bench/.venv/bin/python bench/llama_cpp_run.py MODEL.gguf THREADS N_PREDICT PROMPT
    [LORA.gguf [SCALE]]
Prints one JSON object with the same timing fields as `mica run --json`. With a GGUF LoRA
file, llama.cpp applies it unmerged at SCALE (default 1), as `mica run --lora` does.
"""
import json
import sys
import time

import numpy as np
from llama_cpp import Llama


def main():
    model, threads, n_predict, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    lora = sys.argv[5] if len(sys.argv) > 5 else None
    lora_scale = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False, logits_all=False, flash_attn=True,
                lora_path=lora, lora_scale=lora_scale)
    load_ms = (time.perf_counter() - t0) * 1e3
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    llm.reset()
    t1 = time.perf_counter()
    llm.eval(ids)
    prompt_ms = (time.perf_counter() - t1) * 1e3
    out = []
    t2 = time.perf_counter()
    # As mica: n tokens take n - 1 evaluations (the first comes from the prompt's logits).
    while len(out) < n_predict:
        tok = int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).argmax())
        out.append(tok)
        if len(out) < n_predict:
            llm.eval([tok])
    gen_ms = (time.perf_counter() - t2) * 1e3
    print(json.dumps({
        "engine": "llama.cpp",
        "prompt_ids": ids,
        "output_ids": out,
        "timings": {
            "load_ms": load_ms,
            "prompt_tokens": len(ids),
            "prompt_ms": prompt_ms,
            "prompt_tokens_per_s": len(ids) / prompt_ms * 1e3,
            "gen_tokens": n_predict,
            "gen_ms": gen_ms,
            "gen_tokens_per_s": n_predict / gen_ms * 1e3,
            "threads": threads,
        },
    }))


if __name__ == "__main__":
    main()
