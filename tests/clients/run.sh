#!/usr/bin/env bash
# Real-client and raw-framing checks of `mica serve`: starts the server on 127.0.0.1 with the
# small test model, runs check_clients.py (the `openai` and `ollama` Python clients, installed
# with pip if missing) and `curl -N` checks of the SSE framing, then stops the server.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MICA_TEST_MODELS:-models}
MODEL=smollm2-135m-instruct-q4_1
PORT=${PORT:-18080}
BIN=${MICA_BIN:-target/debug/mica}
[ -x "$BIN" ] || cargo build -q -p mica-cli
python3 -c "import openai, ollama" 2>/dev/null || pip install -q openai ollama
"$BIN" serve -m "$MODELS/$MODEL.gguf" --port "$PORT" -t 2 2>/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
python3 tests/clients/check_clients.py "http://127.0.0.1:$PORT" "$MODEL"
# Raw SSE framing with curl -N: every event is `data: ...` + blank line, the last `data: [DONE]`.
OUT=$(curl -sN "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"stream\":true}")
printf '%s\n' "$OUT" | tail -n 1 | grep -qx 'data: \[DONE\]' || { echo "FAIL curl: no [DONE]"; exit 1; }
printf '%s\n' "$OUT" | grep -v '^$' | grep -qv '^data: ' && { echo "FAIL curl: a non-data line"; exit 1; }
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" -d '{bad')
[ "$CODE" = 400 ] || { echo "FAIL curl: bad JSON gave $CODE"; exit 1; }
echo "curl framing: 2 passed, 0 failed"
