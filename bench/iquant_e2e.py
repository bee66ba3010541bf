#!/usr/bin/env python3
"""End to end for the i-quants (issue 29): SmolLM2-135M quantized by llama.cpp's own
`llama_model_quantize` (llama-cpp-python) and by `mica convert`, then run by both.

From the test Q4_1 GGUF: `mica convert --type f16` gives the common source; `mica imatrix`
computes an importance matrix on fixtures/text/calibration.txt (llama.cpp's GGUF imatrix
format). llama.cpp then writes IQ4_XS (with and without the imatrix) and IQ2_XS (with it;
llama.cpp requires one), mica writes IQ4_XS (with and without) and IQ2_XS (with it). For every
file:
- mica's tensors against llama.cpp's (same type, same bytes) where both wrote the type;
- greedy tokens (48) of mica and llama.cpp on the golden prompts of
  shared/golden/smollm2-135m-instruct-q4_1.json; at a first difference, llama.cpp's gap
  between its top two logits there (a near-tie when small);
- perplexity on fixtures/text/GPL-3 at c=256: `mica perplexity` and llama-perplexity's
  computation (bench/llama_cpp_perplexity.py);
- decode speed: mica's generation tokens/s over the golden runs (mean), and llama.cpp's
  over the same greedy loop (llama-cpp-python, one token per eval), with the CPU named.

Usage: bench/.venv/bin/python bench/iquant_e2e.py WORK_DIR [--models-dir DIR] [-t THREADS]
       [--golden shared/golden/smollm2-135m-instruct-q4_1.json]
(build mica first: cargo build --release -p mica-cli)
"""
import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MICA = REPO / "target" / "release" / "mica"
GOLDEN = REPO.parent / "shared" / "golden" / "smollm2-135m-instruct-q4_1.json"


def sh(cmd):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {out.stderr[-2000:]}")
    return out.stdout


# --- a minimal GGUF reader (enough for imatrix files and tensor comparison) -------------------

GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf(path):
    b = Path(path).read_bytes()
    assert b[:4] == b"GGUF"
    _, n_t, n_kv = struct.unpack_from("<IQQ", b, 4)
    off = 24

    def rstr(o):
        (n,) = struct.unpack_from("<Q", b, o)
        return b[o + 8:o + 8 + n].decode(), o + 8 + n

    def rval(t, o):
        if t in GGUF_SCALAR:
            f = GGUF_SCALAR[t]
            return struct.unpack_from("<" + f, b, o)[0], o + struct.calcsize(f)
        if t == 8:
            return rstr(o)
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            vals = []
            for _ in range(n):
                v, o = rval(et, o)
                vals.append(v)
            return vals, o
        raise ValueError(t)

    kv = {}
    for _ in range(n_kv):
        k, off = rstr(off)
        (t,) = struct.unpack_from("<I", b, off)
        v, off = rval(t, off + 4)
        kv[k] = v
    infos = []
    for _ in range(n_t):
        name, off = rstr(off)
        (nd,) = struct.unpack_from("<I", b, off)
        dims = struct.unpack_from("<" + "Q" * nd, b, off + 4)
        ty, toff = struct.unpack_from("<IQ", b, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 12
        infos.append((name, dims, ty, toff))
    align = kv.get("general.alignment", 32)
    data = (off + align - 1) // align * align
    return kv, infos, b, data


TYPE_SIZE = {0: (1, 4), 1: (1, 2), 8: (32, 34), 12: (256, 144), 14: (256, 210), 10: (256, 84),
             11: (256, 110), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 13: (256, 176),
             16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
             21: (256, 110), 22: (256, 82), 23: (256, 136), 29: (256, 56), 30: (1, 2),
             34: (256, 54), 35: (256, 66), 39: (32, 17)}


def tensors(path):
    _, infos, b, data = read_gguf(path)
    out = {}
    for name, dims, ty, toff in infos:
        n = int(np.prod(dims))
        bs, ts = TYPE_SIZE[ty]
        out[name] = (ty, b[data + toff:data + toff + n // bs * ts])
    return out


def imatrix_entries(path):
    """(name, per-column mean) as llama-quantize reads a GGUF imatrix: in_sum2 / counts."""
    _, infos, b, data = read_gguf(path)
    by = {name: (dims, toff) for name, dims, ty, toff in infos}
    out = []
    for name, (dims, toff) in by.items():
        if not name.endswith(".in_sum2"):
            continue
        base = name[:-len(".in_sum2")]
        cols, nmat = dims[0], (dims[1] if len(dims) > 1 else 1)
        s = np.frombuffer(b, np.float32, cols * nmat, data + toff).reshape(nmat, cols)
        cdims, coff = by[base + ".counts"]
        c = np.frombuffer(b, np.float32, nmat, data + coff)
        e = np.where(c[:, None] > 0, s / np.where(c > 0, c, 1)[:, None], np.float32(1))
        out.append((base, e.astype(np.float32).reshape(-1)))
    return out


# --- llama.cpp ---------------------------------------------------------------------------------

def llama_quantize(src, out, ftype, imatrix=None, threads=2):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype.upper())
    params.nthread = threads
    keep = []
    if imatrix:
        entries = imatrix_entries(imatrix)
        arr = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (name, e) in enumerate(entries):
            keep.append(e)
            arr[i].name = name.encode()
            arr[i].data = e.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = e.size
        arr[len(entries)].name = None
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize {ftype} failed: {rc}")


def llama_greedy(model, cases, n, threads):
    from llama_cpp import Llama
    llm = Llama(model_path=str(model), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False, logits_all=True, flash_attn=True)
    res = {}
    for c in cases:
        llm.reset()
        llm.eval(c["prompt_ids"])
        out, gaps = [], []
        t0 = time.perf_counter()
        while len(out) < n:
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            top = np.argsort(logits)[::-1][:2]
            gaps.append(float(logits[top[0]] - logits[top[1]]))
            out.append(int(top[0]))
            if len(out) < n:
                llm.eval([out[-1]])
        res[c["id"]] = (out, gaps)
        res.setdefault("_tps", []).append((n - 1) / (time.perf_counter() - t0))
    return res


def mica_greedy(model, cases, n, threads):
    res = {}
    for c in cases:
        o = json.loads(sh([MICA, "run", "-m", model, "-p", c["prompt"], "-n", n, "--temp", "0",
                           "--ignore-eos", "-t", threads, "--json"]))
        assert o["prompt_ids"] == c["prompt_ids"], (c["id"], o["prompt_ids"])
        res[c["id"]] = o["output_ids"]
        res.setdefault("_tps", []).append(o["timings"]["gen_tokens_per_s"])
    return res


def ppl_mica(model, text, ctx, threads):
    out = sh([MICA, "perplexity", "-m", model, "-f", text, "-c", ctx, "-t", threads, "--quiet"])
    line = [l for l in out.splitlines() if l.startswith("PPL =")][0]
    return float(line.split()[2])


def ppl_llama(model, text, ctx, threads):
    out = sh([sys.executable, REPO / "bench" / "llama_cpp_perplexity.py", model, text, ctx, threads])
    line = [l for l in out.splitlines() if "PPL" in l][-1]
    return float(line.replace("=", " ").split()[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--models-dir", default=os.environ.get("MICA_TEST_MODELS", "/work/main/models"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--golden", default=str(GOLDEN), help="the golden prompts (shared/golden)")
    ap.add_argument("--only", default="iq4_xs,iq4_xs-imat,iq2_xs-imat",
                    help="comma-separated files to make and run (iq4_xs, iq4_xs-imat, iq2_xs-imat)")
    a = ap.parse_args()
    w = Path(a.work)
    w.mkdir(parents=True, exist_ok=True)
    t = a.threads
    src = w / "smollm2-f16.gguf"
    if not src.exists():
        sh([MICA, "convert", Path(a.models_dir) / "smollm2-135m-instruct-q4_1.gguf", "-o", src,
            "--type", "f16", "--quiet"])
    imat = w / "imatrix.gguf"
    if not imat.exists():
        sh([MICA, "imatrix", "-m", src, "-f", REPO / "fixtures/text/calibration.txt", "-o", imat,
            "-c", 256, "-t", t, "--quiet"])
    files = {}
    only = a.only.split(",")
    for ft, im in [("iq4_xs", False), ("iq4_xs", True), ("iq2_xs", True)]:
        tag = ft + ("-imat" if im else "")
        if tag not in only:
            continue
        p = w / f"llama-{tag}.gguf"
        if not p.exists():
            llama_quantize(src, p, ft, imat if im else None, t)
        files[f"llama.cpp {tag}"] = p
        q = w / f"mica-{tag}.gguf"
        if not q.exists():
            sh([MICA, "convert", src, "-o", q, "--type", ft, "--quiet", "-t", t]
               + (["--imatrix", imat] if im else []))
        lt, mt = tensors(p), tensors(q)
        if lt == mt:
            # Same tensors, same bytes: running mica's file again would repeat the same runs.
            files[f"llama.cpp {tag} (= mica {tag}, byte-identical tensors)"] = files.pop(f"llama.cpp {tag}")
        else:
            files[f"mica {tag}"] = q
        same_type = sum(lt[k][0] == mt[k][0] for k in lt)
        same_bytes = sum(lt[k] == mt[k] for k in lt)
        types = sorted({TYPE_NAMES.get(v[0], v[0]) for v in lt.values()})
        differ = sorted({TYPE_NAMES.get(lt[k][0]) for k in lt if lt[k] != mt[k]})
        print(f"{tag}: {len(lt)} tensors, types {types}; mica's type equal on {same_type}, "
              f"bytes equal on {same_bytes} (types of the others: {differ})")
    cases = [c for c in json.load(open(a.golden))["cases"] if c.get("prompt")]
    text = REPO / "fixtures/text/GPL-3"
    rows = []
    for label, p in files.items():
        lg = llama_greedy(p, cases, 48, t)
        mg = mica_greedy(p, cases, 48, t)
        agree = []
        for c in cases:
            lo, gaps = lg[c["id"]]
            mo = mg[c["id"]]
            k = next((i for i, (x, y) in enumerate(zip(lo, mo)) if x != y), None)
            agree.append(f"{c['id']}: " + ("48/48" if k is None else f"first diff at {k}, "
                                              f"llama.cpp top-2 gap {gaps[k]:.4f}"))
        pm, pl = ppl_mica(p, text, 256, t), ppl_llama(p, text, 256, t)
        speed = (float(np.mean(mg["_tps"])), float(np.mean(lg["_tps"])))
        rows.append((label, pm, pl, agree, speed))
        print(f"{label}: PPL mica {pm:.4f} llama.cpp {pl:.4f} ({(pm / pl - 1) * 100:+.3f}%); "
              + "; ".join(agree) + f"; decode tok/s mica {speed[0]:.1f} llama.cpp {speed[1]:.1f}",
              flush=True)
    print(f"\nCPU: {cpu_name()}, {t} threads")
    print("| file | mica PPL | llama.cpp PPL | Δ | greedy | decode tok/s mica / llama.cpp |")
    print("|---|---:|---:|---:|---|---:|")
    for label, pm, pl, agree, (sm, sl) in rows:
        print(f"| {label} | {pm:.4f} | {pl:.4f} | {(pm / pl - 1) * 100:+.3f}% | {'; '.join(agree)} "
              f"| {sm:.1f} / {sl:.1f} |")


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
              19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 30: "BF16",
              34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}

if __name__ == "__main__":
    main()
