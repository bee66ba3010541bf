#!/usr/bin/env python3
"""`mica run` next to llama.cpp (llama-cpp-python) on one prompt: load time, prompt tokens/s,
generation tokens/s, same GGUF, same threads, greedy, alternating runs; also says whether the
two produced the same tokens.

Usage: bench/.venv/bin/python bench/run_side_by_side.py [--models-dir DIR] [-t 1,2] [-n 64] [-r 3]
(bench/compare installs the venv; build mica first: cargo build --release -p mica-cli)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = {
    "SmolLM2-135M Q4_1": "smollm2-135m-instruct-q4_1.gguf",
    "Gemma3-270M Q4_K_M": "gemma3-270m-q4_k_m.gguf",
    "Qwen2.5-Coder-0.5B Q4_K_M": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
}
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
          "wine-making. Explain in detail how this changed the spread of knowledge in Europe.")


def run_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path,
                    default=Path(os.environ.get("MICA_TEST_MODELS") or REPO / "models"))
    ap.add_argument("-t", "--threads", default="1,2")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", "--reps", type=int, default=3)
    args = ap.parse_args()
    mica = REPO / "target/release/mica"
    rows = []
    for name, file in MODELS.items():
        path = args.models_dir / file
        if not path.exists():
            sys.exit(f"missing {path}: run scripts/fetch-test-models")
        for t in [int(x) for x in args.threads.split(",")]:
            res = {"mica": [], "llama.cpp": []}
            same = True
            for _ in range(args.reps):
                m = run_json([str(mica), "run", "-m", str(path), "-p", PROMPT, "-n", str(args.n),
                              "--temp", "0", "--ignore-eos", "-t", str(t), "--json"])
                l = run_json([sys.executable, str(REPO / "bench/llama_cpp_run.py"), str(path),
                              str(t), str(args.n), PROMPT])
                res["mica"].append(m["timings"])
                res["llama.cpp"].append(l["timings"])
                same &= m["output_ids"][: len(l["output_ids"])] == l["output_ids"]
            med = {e: {k: statistics.median(r[k] for r in v) for k in
                       ("load_ms", "prompt_tokens_per_s", "gen_tokens_per_s")}
                   for e, v in res.items()}
            rows.append((name, t, res["mica"][0]["prompt_tokens"], med, same))
            print(f"done {name} t={t}", file=sys.stderr, flush=True)
    print("| model | threads | prompt tokens | load ms mica / llama.cpp | prompt t/s mica / llama.cpp (ratio) "
          "| gen t/s mica / llama.cpp (ratio) | same tokens |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, t, n_prompt, med, same in rows:
        m, l = med["mica"], med["llama.cpp"]
        print(f"| {name} | {t} | {n_prompt} | {m['load_ms']:.0f} / {l['load_ms']:.0f} "
              f"| {m['prompt_tokens_per_s']:.1f} / {l['prompt_tokens_per_s']:.1f} "
              f"({m['prompt_tokens_per_s'] / l['prompt_tokens_per_s']:.2f}) "
              f"| {m['gen_tokens_per_s']:.1f} / {l['gen_tokens_per_s']:.1f} "
              f"({m['gen_tokens_per_s'] / l['gen_tokens_per_s']:.2f}) | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
