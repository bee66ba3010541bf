#!/usr/bin/env python3
"""The cost of LoRA adapters applied unmerged (`mica run --lora`): decode tokens/s with a
random rank-R adapter on every attention and feed-forward projection of a GGUF model, beside
the same model without one, alternating runs (greedy, speculation off, same prompt).

The adapters are written by this script as llama.cpp GGUF LoRA files (`general.type =
adapter`, `adapter.type = lora`, `blk.N.<proj>.weight.lora_a` `[in, r]` and `.lora_b`
`[r, out]` in ggml's order, f16 as llama.cpp's converter writes them by default or f32,
alpha = r), with the shapes `mica inspect --tensors` reports, so any family works. Their values are random: the text is not the point, the time is.

Several `--mica` binaries (an old and a new build) run side by side, alternating within each
rep; `--llama` adds llama.cpp (through llama-cpp-python, `bench/llama_cpp_run.py`: the same
GGUF, the same LoRA file applied unmerged, the same prompt, token count and threads).

Usage:
    python3 bench/lora_cost.py --mica target/release/mica [--mica OTHER] --model M.gguf
        [--ranks 8,64] [--threads 2] [--tokens 128] [--reps 5] [--dtype f16|f32]
        [--llama [--llama-python bench/.venv/bin/python]]
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


LLAMA_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_cpp_run.py")


def run(engine, model, threads, tokens, lora=None):
    """Decode tokens/s of one fresh process: `engine` is a mica binary or ("llama", python)."""
    if isinstance(engine, tuple):
        # llama_cpp_run.py decodes greedily for `tokens` tokens whatever they are.
        cmd = [engine[1], LLAMA_RUN, model, str(threads), str(tokens), PROMPT]
        cmd += [lora] if lora else []
    else:
        cmd = [engine, "run", "-m", model, "-t", str(threads), "--spec", "off", "--temp", "0",
               "-n", str(tokens), "--ignore-eos", "-p", PROMPT, "--json"]
        cmd += ["--lora", lora] if lora else []
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)["timings"]["gen_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mica", action="append",
                    help="a mica binary (repeat to compare builds; default target/release/mica)")
    ap.add_argument("--llama", action="store_true", help="add llama.cpp (llama-cpp-python)")
    ap.add_argument("--llama-python", default="bench/.venv/bin/python",
                    help="the Python that has llama_cpp (default bench/.venv/bin/python)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ranks", default="8,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    a = ap.parse_args()
    micas = a.mica or ["target/release/mica"]
    engines = [(m, m) for m in micas]
    if a.llama:
        engines.append(("llama.cpp", ("llama", a.llama_python)))
    arch, targets = shapes(micas[0], a.model)
    rng = random.Random(1)
    tmp = tempfile.mkdtemp(prefix="mica-lora-cost-")
    files = {None: None}
    for r in map(int, a.ranks.split(",")):
        files[r] = os.path.join(tmp, f"r{r}.gguf")
        write_lora(files[r], arch, targets, r, rng, a.dtype)
    ts = {(e, r): [] for e, _ in engines for r in files}
    for _ in range(a.reps):
        for e, how in engines:
            for r, f in files.items():
                ts[(e, r)].append(run(how, a.model, a.threads, a.tokens, f))
    print(f"{os.path.basename(a.model)}: {len(targets)} projections, {a.dtype} adapters, "
          f"{a.threads} threads, {a.tokens} tokens, {a.reps} alternating reps: decode t/s, "
          "median (min-max), and vs none")
    print("| adapter | " + " | ".join(e for e, _ in engines) + " |")
    print("| --- |" + " ---: |" * len(engines))
    for r in files:
        cells = []
        for e, _ in engines:
            v, b = ts[(e, r)], statistics.median(ts[(e, None)])
            m = statistics.median(v)
            cell = f"{m:.1f} ({min(v):.1f}-{max(v):.1f})"
            cells.append(cell + (f" {100 * (m / b - 1):+.1f}%" if r else ""))
        print(f"| {'none' if r is None else f'rank {r}'} | " + " | ".join(cells) + " |")
    del files[None]
    for f in files.values():
        os.remove(f)
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
