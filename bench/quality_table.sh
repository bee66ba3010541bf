#!/usr/bin/env bash
# The quality table of docs/convert.md: perplexity (-c 256 over fixtures/text/GPL-3) of
# mica's conversions of a float32 Hugging Face folder of SmolLM2-135M, beside llama.cpp's own
# quantization of the same weights (llama_model_quantize through llama-cpp-python, from the
# F32 GGUF mica writes from the folder), with sizes and bits per weight.
#
# Usage: bench/quality_table.sh HF_FOLDER OUT_DIR [MICA_BINARY]
#   HF_FOLDER: e.g. the folder fixtures/hf/real_smollm2.py writes (float32 safetensors)
#   Needs bench/.venv (llama-cpp-python) for the llama.cpp side.
# The importance matrix is computed on fixtures/text/calibration.txt (other licence texts:
# Apache-2.0, MPL-2.0, GFDL-1.3, Artistic, CC0), never on the evaluated text.
set -euo pipefail
HF=${1:?HF folder}
OUT=${2:?output dir}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MICA=${3:-$ROOT/target/release/mica}
PY=${PY:-$ROOT/bench/.venv/bin/python}
TEXT=$ROOT/fixtures/text/GPL-3
CALIB=$ROOT/fixtures/text/calibration.txt
T=${THREADS:-2}
mkdir -p "$OUT"
cd "$OUT"

"$MICA" convert "$HF" -o f32.gguf --type f32 --quiet
for t in f16 q8_0 q6_k q4_k q4_0; do
  "$MICA" convert "$HF" -o "mica-$t.gguf" --type "$t" --quiet 2> "convert-$t.log"
done
for t in f16 q8_0 q6_k q4_k_m q4_0; do
  "$PY" "$ROOT/bench/llama_cpp_perplexity.py" --quantize f32.gguf "llama-$t.gguf" "$t" > /dev/null 2>&1
done
for t in f16 q8_0 q6_k q4_0; do
  "$PY" "$ROOT/bench/compare_gguf_tensors.py" "mica-$t.gguf" "llama-$t.gguf" | tail -n 1
done
"$PY" "$ROOT/bench/compare_gguf_tensors.py" mica-q4_k.gguf llama-q4_k_m.gguf | tail -n 1

# Importance matrix (8 windows of 512 tokens), weighted conversions and mixes.
"$MICA" imatrix -m mica-q8_0.gguf -f "$CALIB" -o imatrix.gguf -c 512 --chunks 8 -t "$T" --quiet
"$MICA" convert "$HF" -o mica-q4_k-im.gguf --type q4_k --imatrix imatrix.gguf --quiet
"$MICA" convert "$HF" -o mica-q4_0-im.gguf --type q4_0 --imatrix imatrix.gguf --quiet
"$MICA" convert "$HF" -o mica-mix4.5.gguf --mix 4.5 --imatrix imatrix.gguf --quiet 2> mix4.5.log
# The uniform Q4_K_M file's own bits per weight (its 576-wide rows fall back to Q5_0/Q8_0).
Q4K_BPW=$(grep -o '[0-9.]* bits per weight' convert-q4_k.log | cut -d' ' -f1)
"$MICA" convert "$HF" -o mica-mix-q4k-size.gguf --mix "$Q4K_BPW" --imatrix imatrix.gguf --quiet 2> mix-q4k.log
# The same budgets with --calibrate: the importance matrix computed from the source on the
# calibration text, and each tensor's sensitivity measured as the model's KL-divergence.
for b in 4.5 4.75 5 "$Q4K_BPW"; do
  "$MICA" convert "$HF" -o "mica-klmix$b.gguf" --mix "$b" --calibrate "$CALIB" \
    --calibrate-chunks 8 -t "$T" --quiet 2> "klmix$b.log"
done
# 4.5 BPW with error compensation (GPTQ), calibrated on every window of the text.
"$MICA" convert "$HF" -o mica-gptqmix4.5.gguf --mix 4.5 --calibrate "$CALIB" --gptq -t "$T" \
  --quiet 2> gptqmix4.5.log

for f in f32 mica-f16 mica-q8_0 mica-q6_k mica-q4_k mica-q4_k-im mica-q4_0 mica-q4_0-im \
         mica-mix4.5 mica-mix-q4k-size mica-klmix4.5 mica-klmix4.75 mica-klmix5 \
         "mica-klmix$Q4K_BPW" mica-gptqmix4.5; do
  printf '%s\t%s\t' "$f" "$(stat -c %s "$f.gguf")"
  "$MICA" perplexity -m "$f.gguf" -f "$TEXT" -c 256 -t "$T" --quiet 2> /dev/null | head -n 1
done
