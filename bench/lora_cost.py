#!/usr/bin/env python3
"""The cost of LoRA adapters applied unmerged (`mica run --lora`): decode tokens/s with a
random rank-R adapter on every attention and feed-forward projection of a GGUF model, beside
the same model without one, alternating runs (greedy, speculation off, same prompt).

The adapters are written by this script as llama.cpp GGUF LoRA files (`general.type =
adapter`, `adapter.type = lora`, `blk.N.<proj>.weight.lora_a` `[in, r]` and `.lora_b`
`[r, out]` in ggml's order, f16 as llama.cpp's converter writes them by default or f32,
alpha = r), with the shapes `mica inspect --tensors` reports, so any family works. Their values are random: the text is not the point, the time is.

Usage:
    python3 bench/lora_cost.py --mica target/release/mica --model M.gguf [--ranks 8,64]
        [--threads 2] [--tokens 128] [--reps 5] [--dtype f16|f32]
"""
import argparse
import json
import os
import random
import re
import statistics
import struct
import subprocess
import tempfile

PROJ = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
PROMPT = ("Write a long, detailed story about a lighthouse keeper who finds a message in a "
          "bottle, with dialogue and a twist at the end.")


def shapes(mica, model):
    """{tensor name: (in, out)} of the targeted projections, from `mica inspect --tensors`."""
    out = subprocess.run([mica, "inspect", model, "--tensors"], capture_output=True, text=True,
                         check=True).stdout
    arch = re.search(r"architecture:\s+(\S+)", out).group(1)
    found = {}
    for m in re.finditer(r"(blk\.\d+\.(\w+)\.weight)\s+\S+\s+\[(\d+), (\d+)\]", out):
        if m.group(2) in PROJ:
            found[m.group(1)] = (int(m.group(3)), int(m.group(4)))
    return arch, found


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_lora(path, arch, targets, r, rng, dtype, std=0.02):
    """A GGUF v3 LoRA file: A `[in, r]` and B `[r, out]` per target (ggml order), in
    `dtype` (f16 or f32), values drawn from N(0, std)."""
    ty, size, fmt = {"f32": (0, 4, "f"), "f16": (1, 2, "e")}[dtype]
    kv = [("general.architecture", 8, gguf_string(arch)),
          ("general.type", 8, gguf_string("adapter")),
          ("adapter.type", 8, gguf_string("lora")),
          ("adapter.lora.alpha", 6, struct.pack("<f", float(r)))]
    tensors = []
    for name, (n_in, n_out) in sorted(targets.items()):
        tensors.append((name + ".lora_a", (n_in, r)))
        tensors.append((name + ".lora_b", (r, n_out)))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, vty, v in kv:
        head += gguf_string(k) + struct.pack("<I", vty) + v
    offset, infos = 0, b""
    for name, (d0, d1) in tensors:
        infos += gguf_string(name) + struct.pack("<I", 2) + struct.pack("<QQ", d0, d1)
        infos += struct.pack("<IQ", ty, offset)
        offset += size * d0 * d1
        offset += (-offset) % 32
    blob = head + infos
    blob += b"\0" * ((-len(blob)) % 32)
    with open(path, "wb") as f:
        f.write(blob)
        for _, (d0, d1) in tensors:
            n = d0 * d1
            f.write(struct.pack(f"<{n}{fmt}", *(rng.gauss(0.0, std) for _ in range(n))))
            f.write(b"\0" * ((-size * n) % 32))


def run(mica, model, threads, tokens, lora=None):
    cmd = [mica, "run", "-m", model, "-t", str(threads), "--spec", "off", "--temp", "0",
           "-n", str(tokens), "--ignore-eos", "-p", PROMPT, "--json"]
    if lora:
        cmd += ["--lora", lora]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)["timings"]["gen_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mica", default="target/release/mica")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ranks", default="8,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    a = ap.parse_args()
    arch, targets = shapes(a.mica, a.model)
    rng = random.Random(1)
    tmp = tempfile.mkdtemp(prefix="mica-lora-cost-")
    files = {}
    for r in map(int, a.ranks.split(",")):
        files[r] = os.path.join(tmp, f"r{r}.gguf")
        write_lora(files[r], arch, targets, r, rng, a.dtype)
    base, with_ = [], {r: [] for r in files}
    for _ in range(a.reps):
        base.append(run(a.mica, a.model, a.threads, a.tokens))
        for r, f in files.items():
            with_[r].append(run(a.mica, a.model, a.threads, a.tokens, f))
    b = statistics.median(base)
    print(f"{os.path.basename(a.model)}: {len(targets)} projections, {a.dtype} adapters, "
          f"{a.threads} threads, {a.tokens} tokens, {a.reps} alternating reps (medians)")
    print(f"| adapter | decode t/s | vs none |\n| --- | ---: | ---: |\n| none | {b:.1f} | |")
    for r, v in with_.items():
        m = statistics.median(v)
        print(f"| rank {r} | {m:.1f} | {100 * (m / b - 1):+.1f}% |")
    for f in files.values():
        os.remove(f)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
