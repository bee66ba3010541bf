#!/usr/bin/env python3
"""Random weights with Qwen3.5-0.8B's text shapes (24 layers of 1024: 18 Gated DeltaNet
layers with 16 heads of 128, 6 gated attention layers with 8 query / 2 key-value heads of
256, feed-forward 3584) but a 4096-token vocabulary, as a Q8_0 GGUF: a model the size of
the smallest published Qwen3.5 in its layers, for timing the engine on a hybrid model
(e.g. the second chat turn with and without state checkpoints, `second_turn_timing` in
crates/mica-engine/tests/hybrid.rs). Its text is meaningless.

Needs the fixture environment of fixtures/hf/make_fixtures.py (torch, transformers ≥ 5.23,
safetensors) and llama.cpp's converter at $MICA_LLAMA_CPP. About 1 GiB of scratch space
(deleted after conversion), a 535 MB result, under a minute.

Usage:
  python bench/qwen35_small_shapes.py OUT.gguf
  MICA_HYBRID_TIMING_GGUF=OUT.gguf MICA_HYBRID_TIMING_SHAPE=400,100,30 \\
      cargo test -p mica-engine --test hybrid second_turn_timing -- --ignored --nocapture
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "fixtures" / "hf"))

import make_fixtures  # noqa: E402
import real_size  # noqa: E402
import transformers  # noqa: E402

SPEC = dict(
    vocab_size=4096, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256, attn_output_gate=True,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    full_attention_interval=4, max_position_embeddings=262144, tie_word_embeddings=True,
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25,
                         mrope_section=[11, 11, 10], mrope_interleaved=True),
)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    cfg = transformers.Qwen3_5TextConfig(**SPEC)
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    scratch = Path(tempfile.mkdtemp(prefix="qwen35-shapes-"))
    try:
        real_size.draw(cfg, scratch, 0)
        subprocess.run([sys.executable, "-c", make_fixtures.CONVERT_DRIVER,
                        make_fixtures.LLAMA_CPP, str(scratch), "--outtype", "q8_0",
                        "--outfile", str(out), "--no-mtp"], check=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
