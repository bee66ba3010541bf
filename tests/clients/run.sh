#!/usr/bin/env bash
# Real-client and raw-framing checks of `mica serve`: starts the server on 127.0.0.1 with the
# small test model and an API key, runs check_clients.py (the `openai` and `ollama` Python
# clients, installed into a virtual environment this script creates under target/) and `curl`
# checks of the SSE framing, the origin check and the content-type check, then stops the
# server; check_lora.py loads a LoRA adapter at run time and selects it by model name. Then
# structured output and tools: the `openai` SDK's `chat.completions.parse` on a
# few schemas per model (structured_sweep.py --limit; run it without --limit for the full
# 20-schema sweep with the unconstrained contrast) and check_tools.py on Qwen2.5-Coder (a
# second server). Fails loudly when the clients cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${MICA_TEST_MODELS:-models}
MODEL=smollm2-135m-instruct-q4_1
PORT=${PORT:-18080}
KEY=clients-key
BIN=${MICA_BIN:-target/debug/mica}
VENV=${CLIENTS_VENV:-target/clients-venv}
[ -x "$BIN" ] || cargo build -q -p mica-cli
if ! "$VENV/bin/python" -c "import openai, ollama, jsonschema" 2>/dev/null; then
  python3 -m venv "$VENV" || { echo "FAIL: cannot create a Python virtual environment in $VENV"; exit 1; }
  "$VENV/bin/pip" install -q openai ollama jsonschema \
    || { echo "FAIL: pip could not install the openai and ollama clients into $VENV"; exit 1; }
fi
"$BIN" serve -m "$MODELS/$MODEL.gguf" --port "$PORT" -t 2 --api-key "$KEY" 2>/dev/null &
PID=$!
QPID=
trap 'kill $PID $QPID 2>/dev/null; wait $PID $QPID 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
"$VENV/bin/python" tests/clients/check_clients.py "http://127.0.0.1:$PORT" "$MODEL" "$KEY"
"$VENV/bin/python" tests/clients/check_lora.py "http://127.0.0.1:$PORT" "$MODEL" "$KEY"
AUTH="Authorization: Bearer $KEY"
JSON="Content-Type: application/json"
# Raw SSE framing with curl -N: every event is `data: ...` + blank line, the last `data: [DONE]`.
OUT=$(curl -sN "http://127.0.0.1:$PORT/v1/chat/completions" -H "$JSON" -H "$AUTH" \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"stream\":true}")
printf '%s\n' "$OUT" | tail -n 1 | grep -qx 'data: \[DONE\]' || { echo "FAIL curl: no [DONE]"; exit 1; }
printf '%s\n' "$OUT" | grep -v '^$' | grep -qv '^data: ' && { echo "FAIL curl: a non-data line"; exit 1; }
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" -H "$JSON" -H "$AUTH" -d '{bad')
[ "$CODE" = 400 ] || { echo "FAIL curl: bad JSON gave $CODE"; exit 1; }
# A page on a foreign origin posting text/plain (a browser "simple request") is refused.
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" -H "$AUTH" \
  -H 'Origin: http://evil.example' -H 'Content-Type: text/plain' -d "{\"model\":\"$MODEL\",\"prompt\":\"x\"}")
[ "$CODE" = 403 ] || { echo "FAIL curl: foreign origin gave $CODE"; exit 1; }
# curl's default form content type is not JSON.
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/generate" -H "$AUTH" \
  -d "{\"model\":\"$MODEL\",\"prompt\":\"x\"}")
[ "$CODE" = 415 ] || { echo "FAIL curl: form content type gave $CODE"; exit 1; }
echo "curl checks: 4 passed, 0 failed"
"$VENV/bin/python" tests/clients/structured_sweep.py "http://127.0.0.1:$PORT" "$MODEL" "$KEY" \
  --limit 4 --no-contrast
QMODEL=qwen2.5-coder-0.5b-instruct-awq-q4_k_m
QPORT=$((PORT + 1))
"$BIN" serve -m "$MODELS/$QMODEL.gguf" --port "$QPORT" -t 2 --api-key "$KEY" 2>/dev/null &
QPID=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$QPORT/health" >/dev/null && break; sleep 0.1; done
"$VENV/bin/python" tests/clients/check_tools.py "http://127.0.0.1:$QPORT" "$QMODEL" "$KEY"
"$VENV/bin/python" tests/clients/structured_sweep.py "http://127.0.0.1:$QPORT" "$QMODEL" "$KEY" \
  --limit 4 --no-contrast
