#!/usr/bin/env python3
"""Speculative decoding side by side: mica plain vs mica speculative (n-gram lookup, and a
draft model when given) vs llama.cpp plain and with prompt lookup (llama-cpp-python's
`LlamaPromptLookupDecoding` over llama.cpp's batched evaluation), on the fixed prompt set in
bench/spec/prompts (one task per file: code edits, extraction, JSON reformatting, open-ended
chat), greedy, same GGUF, same threads.

Every engine gets the same prompt token ids: the task's text in the model's chat template,
as `mica run --chat` tokenizes it. Per task and mode it reports generation tokens/s, the
speed-up over mica plain, the acceptance rate (accepted / drafted tokens), the mean tokens
per forward pass (accepted drafts + 1), and whether the tokens equal mica plain's.

Usage (from the repository root; llama.cpp modes need llama-cpp-python, e.g. bench/.venv):
  bench/.venv/bin/python bench/spec/run.py -m models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf \
      -t 2 -n 256 [--draft-model M [--draft-layers L]] [--tasks rename,json] [--json out.json]
Modes: --modes mica-plain,mica-ngram,mica-draft,llama-plain,llama-lookup (default: all that
apply; mica-draft needs --draft-model).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def tasks(names):
    d = os.path.join(HERE, "prompts")
    out = []
    for f in sorted(os.listdir(d)):
        name = os.path.splitext(f)[0]
        if names and name not in names:
            continue
        out.append((name, os.path.join(d, f)))
    return out


def mica(args, prompt_file, spec):
    cmd = [args.mica, "run", "-m", args.model, "-f", prompt_file, "--chat", "-n", str(args.n),
           "--temp", "0", "-t", str(args.threads), "-c", "4096", "--json", "--spec", spec]
    if spec == "draft":
        cmd += ["--draft-model", args.draft_model, "--spec-max", str(args.spec_max)]
        if args.draft_layers:
            cmd += ["--draft-layers", str(args.draft_layers)]
    elif spec == "ngram":
        cmd += ["--spec-max", str(args.spec_max)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"mica failed ({' '.join(cmd)}):\n{r.stderr}")
    v = json.loads(r.stdout)
    t = v["timings"]
    return {
        "prompt_ids": v["prompt_ids"],
        "ids": v["output_ids"],
        "tps": t["gen_tokens_per_s"],
        "drafted": t["draft_tokens"],
        "accepted": t["accepted_draft_tokens"],
        "passes": t["gen_passes"],
        "tokens": t["gen_tokens"],
    }


class Counting:
    """Wraps a llama-cpp-python draft model, counting drafted and accepted tokens."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = self.drafted = self.accepted = 0
        self.last = None

    def __call__(self, input_ids, **kw):
        n = len(input_ids)
        if self.last is not None:
            hist, k = self.last
            self.accepted += min(max(n - hist - 1, 0), k)
        d = self.inner(input_ids, **kw)
        self.calls += 1
        self.drafted += len(d)
        self.last = (n, len(d))
        return d


_llms = {}


def llama(args, prompt_ids, lookup):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = Counting(LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=args.spec_max)) \
        if lookup else None
    # logits_all with a draft model: llama-cpp-python sizes its score buffer by the
    # argument, not by the draft model's need for every position's logits (0.3.x).
    llm = Llama(model_path=args.model, n_ctx=4096, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=512, verbose=False, flash_attn=True,
                logits_all=lookup, draft_model=draft)
    ids = []
    t_first = None
    for tok in llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                            repeat_penalty=1.0, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        if llm.token_eos() == tok:
            break
        ids.append(int(tok))
        if len(ids) >= args.n:
            break
    gen_s = time.perf_counter() - t_first
    out = {"ids": ids, "tps": len(ids) / gen_s if gen_s > 0 else 0.0, "tokens": len(ids)}
    if draft:
        out.update(drafted=draft.drafted, accepted=draft.accepted, passes=draft.calls)
    del llm
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=256, help="tokens to generate at most")
    ap.add_argument("--mica", default=os.path.join(ROOT, "target/release/mica"))
    ap.add_argument("--draft-model")
    ap.add_argument("--draft-layers", type=int)
    ap.add_argument("--spec-max", type=int, default=16)
    ap.add_argument("--tasks", default="", help="comma-separated task names (default: all)")
    ap.add_argument("--modes", default="")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m] or \
        ["mica-plain", "mica-ngram"] + (["mica-draft"] if args.draft_model else []) + \
        ["llama-plain", "llama-lookup"]
    if "mica-plain" not in modes:
        modes.insert(0, "mica-plain")  # the baseline every row is compared with
    results = []
    print(f"model {os.path.basename(args.model)} | threads {args.threads} | n {args.n}"
          f" | spec-max {args.spec_max}" + (f" | draft {args.draft_model}"
                                            f" layers {args.draft_layers}" if args.draft_model else ""))
    print(f"| {'task':12} | {'mode':12} | {'tok/s':>7} | {'vs plain':>8} | {'accept':>6} |"
          f" {'tok/pass':>8} | {'same tokens':11} |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for name, path in tasks([t for t in args.tasks.split(",") if t]):
        base = None
        for mode in modes:
            if mode.startswith("mica-"):
                r = mica(args, path, mode[5:].replace("plain", "off"))
                if mode == "mica-plain":
                    base = r
            else:
                r = llama(args, base["prompt_ids"], mode == "llama-lookup")
            drafted = r.get("drafted", 0)
            rate = r["accepted"] / drafted if drafted else None
            per_pass = r["tokens"] / r["passes"] if r.get("passes") else 1.0
            same = r["ids"] == base["ids"]
            row = {"task": name, "mode": mode, "tokens": r["tokens"], "tok_s": r["tps"],
                   "speedup": r["tps"] / base["tps"], "drafted": drafted,
                   "accepted": r.get("accepted", 0), "acceptance": rate,
                   "tokens_per_pass": per_pass, "same_as_mica_plain": same}
            results.append(row)
            acc = f"{rate:6.0%}" if rate is not None else "     -"
            print(f"| {name:12} | {mode:12} | {r['tps']:7.1f} | {row['speedup']:7.2f}x | {acc} |"
                  f" {per_pass:8.2f} | {str(same):11} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
