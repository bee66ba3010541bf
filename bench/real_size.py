#!/usr/bin/env python3
"""Speed at a real size: random weights with the configuration of a published model,
converted and quantized as a user's download would be, then `bench/compare` (mica against
llama.cpp) on the result. The text such a model writes is meaningless; its speed is not.

Steps (each skipped when its output exists, unless --force):
  1. draw:     a safetensors folder with the model's config.json (transformers' own config
               class, so every derived field is as transformers resolves it) and random
               bfloat16 weights for every tensor the transformers model has (names and
               shapes from the model built on the meta device: no memory for it), written
               in shards of about 2 GiB, the largest tables in row chunks;
  2. convert:  llama.cpp's convert_hf_to_gguf.py (the vendored tree of llama-cpp-python's
               sources, $MICA_LLAMA_CPP) with a placeholder vocabulary of the model's size
               (the folder has no tokenizer), to --via (Q8_0 by default: half the disk of
               BF16), then the folder is deleted unless --keep;
  3. quantize: llama.cpp's llama_model_quantize (bench/.venv's llama-cpp-python) to Q4_K_M
               (requantizing from Q8_0 changes no tensor's type, only its values);
  4. compare:  bench/compare -m <the Q4_K_M file> -t 2 -p 512 -n 128 (override with
               --compare-args).

Configurations (CONFIGS): `qwen35` is the smallest published Qwen3.5 text model,
Qwen3.5-0.8B (24 layers of 1024: 18 Gated DeltaNet and 6 gated attention layers, a tied
248320-token vocabulary). `gemma4` is the smallest published Gemma 4 text model,
gemma-4-E2B (35 layers of 1536, 4 sliding layers per global one, per-layer embeddings of
256, the last 20 layers sharing keys and values with double-wide feed-forwards, a
262144-token vocabulary: 5.1 B parameters, most of them the two embedding tables).
`--layers N` and `--vocab V` shrink it for a quick check that the pipeline runs (the shared
layers stay the same fraction); a real measurement uses neither.

Needs: a Python with torch, transformers (≥ 5.23, which has Gemma 4) and safetensors — the
fixture environment of fixtures/hf/make_fixtures.py — and bench/.venv (bench/compare makes
it). Full size: about 10 GiB for the folder plus 5.5 GiB for the Q8_0 file at the peak (the
folder is deleted after conversion), 3.3 GiB left at the end; 15-30 minutes on 2 cores
before the benchmark.

Usage:
  python bench/real_size.py gemma4                          # the full-size measurement
  python bench/real_size.py gemma4 --layers 10 --vocab 4096 --out /tmp/rs \\
      --compare-args "-t 2 -p 32 -n 8 -r 1"                 # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "fixtures" / "hf"))

# The smallest published Gemma 4 text model (gemma-4-E2B's text_config).
GEMMA4_E2B = dict(
    cls="Gemma4TextConfig", vocab_size=262144, vocab_size_per_layer_input=262144,
    hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
    num_key_value_heads=1, head_dim=256, global_head_dim=512, hidden_size_per_layer_input=256,
    num_kv_shared_layers=20, use_double_wide_mlp=True, attention_k_eq_v=False,
    enable_moe_block=False, sliding_window=512, final_logit_softcapping=30.0,
    max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0,
    layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
    rope_parameters={
        "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.25,
                               rope_theta=1000000.0),
        "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
    },
)

# The smallest published Qwen3.5 text model (Qwen3.5-0.8B's text_config): 24 layers of 1024,
# three Gated DeltaNet layers (16 heads of 128) per gated attention layer (8 query / 2
# key-value heads of 256), feed-forward 3584, a tied 248320-token vocabulary. The converter
# is told to leave out the multi-token-prediction layer (mica does not run it).
QWEN35_08B = dict(
    cls="Qwen3_5TextConfig", vocab_size=248320, hidden_size=1024, intermediate_size=3584,
    num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    attn_output_gate=True, linear_num_key_heads=16, linear_num_value_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6, full_attention_interval=4, max_position_embeddings=262144,
    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[11, 11, 10], mrope_interleaved=True),
)

CONFIGS = {"gemma4": GEMMA4_E2B, "qwen35": QWEN35_08B}
# Extra arguments for llama.cpp's converter, per family.
CONVERT_ARGS = {"qwen35": ["--no-mtp"]}
SHARD_BYTES = 2 << 30
ROW_CHUNK_BYTES = 256 << 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def config(family: str, layers: int | None, vocab: int | None):
    import transformers

    spec = dict(CONFIGS[family])
    cls = getattr(transformers, spec.pop("cls"))
    if layers is not None:
        n = spec["num_hidden_layers"]
        if "layer_types" in spec:
            types = spec["layer_types"] = spec["layer_types"][:layers]
        if spec.get("num_kv_shared_layers"):  # (only families with layer_types have it)
            # The same fraction of unshared layers, at least up to the first global one (a
            # shared layer reuses an unshared layer of its kind).
            unshared = math.ceil((n - spec["num_kv_shared_layers"]) * layers / n)
            unshared = max(unshared, types.index("full_attention") + 1)
            spec["num_kv_shared_layers"] = max(0, layers - unshared)
        spec["num_hidden_layers"] = layers
    if vocab is not None:
        spec["vocab_size"] = vocab
        if "vocab_size_per_layer_input" in spec:
            spec["vocab_size_per_layer_input"] = vocab
    cfg = cls(**spec)
    cfg.architectures = [cls.__name__.replace("TextConfig", "ForCausalLM")]
    # transformers checks that every shared layer has an unshared layer of its type.
    getattr(cfg, "kv_sharing_modes", None)
    return cfg


def draw(cfg, folder: Path, seed: int) -> None:
    """Random bfloat16 weights for every tensor the model saves, in shards."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    state = model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    gen = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    shards, shard, size = [], {}, 0

    def flush():
        nonlocal shard, size
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            shards.append((name, list(shard)))
            shard, size = {}, 0

    total = sum(t.numel() for t in state.values())
    done = 0
    for name, meta in state.items():
        t = torch.empty(meta.shape, dtype=torch.bfloat16)
        flat = t.view(-1) if t.dim() > 0 else t.view(1)
        step = max(1, ROW_CHUNK_BYTES // 4)
        for i in range(0, flat.numel(), step):
            n = min(step, flat.numel() - i)
            x = torch.randn(n, generator=gen)
            if "norm" in name:
                x = 1.0 + 0.1 * x  # plain x·w norms: weights around 1
            elif name.endswith("layer_scalar"):
                x = torch.ones(n)
            else:
                x = 0.02 * x
            flat[i:i + n] = x.to(torch.bfloat16)
        if size and size + t.numel() * 2 > SHARD_BYTES:
            flush()
        shard[name], size = t, size + t.numel() * 2
        done += t.numel()
        if t.numel() > 50_000_000:
            log(f"  {name} {tuple(t.shape)}: {done / total:.0%} drawn")
    flush()
    index = {"metadata": {"total_size": 2 * total},
             "weight_map": {n: f for f, names in shards for n in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    cfg.to_json_file(str(folder / "config.json"))
    # The converter trims the embedding to the tokenizer's vocabulary: a stub of the full size.
    vocab = {f"t{i}": i for i in range(cfg.vocab_size)}
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab},
                                                       "added_tokens": []}))
    log(f"drew {total / 1e9:.2f} B parameters into {len(shards)} shards")


def convert(folder: Path, out: Path, via: str, extra: list[str]) -> None:
    import make_fixtures

    subprocess.run([sys.executable, "-c", make_fixtures.CONVERT_DRIVER, make_fixtures.LLAMA_CPP,
                    str(folder), "--outtype", via, "--outfile", str(out), *extra], check=True)


QUANTIZE = r"""
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
p.nthread = int(sys.argv[3])
p.allow_requantize = True
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p))
sys.exit(rc)
"""


def quantize(src: Path, dst: Path, threads: int) -> None:
    py = BENCH / ".venv" / "bin" / "python"
    if not py.is_file():
        sys.exit(f"{py} is missing: run bench/compare once to make it")
    subprocess.run([str(py), "-c", QUANTIZE, str(src), str(dst), str(threads)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=sorted(CONFIGS))
    ap.add_argument("--out", type=Path, help="working directory (default bench/real_size/<family>)")
    ap.add_argument("--layers", type=int, help="fewer layers (a quick check, not a measurement)")
    ap.add_argument("--vocab", type=int, help="a smaller vocabulary (a quick check)")
    ap.add_argument("--via", choices=["q8_0", "bf16", "f16"], default="q8_0",
                    help="the converter's output type, quantized from (default q8_0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="quantizer threads (default 2)")
    ap.add_argument("--keep", action="store_true", help="keep the safetensors folder")
    ap.add_argument("--force", action="store_true", help="redo every step")
    ap.add_argument("--no-compare", action="store_true", help="stop after quantizing")
    ap.add_argument("--compare-args", default="-t 2 -p 512 -n 128",
                    help='arguments for bench/compare (default "-t 2 -p 512 -n 128")')
    args = ap.parse_args()

    small = args.layers is not None or args.vocab is not None
    tag = args.family + (f"-l{args.layers}" if args.layers else "") + (
        f"-v{args.vocab}" if args.vocab else "")
    out = args.out or BENCH / "real_size" / tag
    out.mkdir(parents=True, exist_ok=True)
    folder, mid, final = out / "hf", out / f"model.{args.via}.gguf", out / "model.q4_k_m.gguf"

    cfg = config(args.family, args.layers, args.vocab)
    if args.force or not (final.is_file() or mid.is_file() or (folder / "config.json").is_file()):
        log(f"[1/4] drawing {tag} into {folder}")
        shutil.rmtree(folder, ignore_errors=True)
        draw(cfg, folder, args.seed)
    if args.force or not (final.is_file() or mid.is_file()):
        log(f"[2/4] converting to {mid.name} (llama.cpp's convert_hf_to_gguf.py)")
        convert(folder, mid, args.via, CONVERT_ARGS.get(args.family, []))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    if args.force or not final.is_file():
        log(f"[3/4] quantizing to {final.name} (llama.cpp's llama_model_quantize)")
        quantize(mid, final, args.threads)
        mid.unlink()
    log(f"{final}: {final.stat().st_size / 2**30:.2f} GiB" + (" (shrunk: not a measurement)"
                                                              if small else ""))
    if args.no_compare:
        return
    cmd = [str(BENCH / "compare"), "-m", str(final), *shlex.split(args.compare_args)]
    log(f"[4/4] {' '.join(shlex.quote(c) for c in cmd)}")
    sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
