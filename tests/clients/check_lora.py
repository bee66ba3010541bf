#!/usr/bin/env python3
"""The `openai` SDK selecting a LoRA adapter of `mica serve` (run: tests/clients/run.sh):
writes a random rank-4 PEFT adapter for SmolLM2-135M (q_proj and v_proj of its 30 layers),
loads it at run time (`POST /admin/lora-adapters`, with the API key given as the third
argument), then checks that `models.list` shows it as `MODEL:ADAPTER`, that a completion for
that model name differs from the base model's and equals one asking for the adapter with
llama-server's `lora` field, and that unloading it makes the model name an error. Exits
non-zero on the first failure and prints 'N passed, 0 failed' at the end."""

import json
import random
import struct
import tempfile
import urllib.request
from pathlib import Path

import openai

from common import args, check, done, openai_client

url, model, key = args()


def write_adapter(folder: Path, n_layer=30, n_embd=576, kv_dim=192, r=4):
    rng = random.Random(7)
    header, data = {}, bytearray()
    for layer in range(n_layer):
        for proj, out in (("q_proj", n_embd), ("v_proj", kv_dim)):
            m = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            for name, shape, amp in ((f"{m}.lora_A.weight", [r, n_embd], 0.1),
                                     (f"{m}.lora_B.weight", [out, r], 0.2)):
                start = len(data)
                n = shape[0] * shape[1]
                data += struct.pack(f"<{n}f", *(rng.uniform(-amp, amp) for _ in range(n)))
                header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [start, len(data)]}
    h = json.dumps(header).encode()
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + data)
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": ["q_proj", "v_proj"],
         "bias": "none"}))


def admin(method, path, body=None):
    req = urllib.request.Request(f"{url}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return r.status, json.loads(r.read())


folder = Path(tempfile.mkdtemp(prefix="mica-lora-client-"))
write_adapter(folder)
status, entry = admin("POST", "/admin/lora-adapters", {"name": "rnd", "path": str(folder)})
check("POST /admin/lora-adapters", status == 200 and entry["name"] == "rnd", entry)

oa = openai_client(url, key)
models = [m.id for m in oa.models.list()]
check("openai models.list shows MODEL:ADAPTER", f"{model}:rnd" in models, models)


def complete(m, **kw):
    return oa.completions.create(model=m, prompt="The capital of France is", max_tokens=12,
                                 temperature=0, **kw).choices[0].text


base = complete(model)
adapted = complete(f"{model}:rnd")
check("openai model name selects the adapter", adapted != base, (base, adapted))
check("the lora field gives the same",
      complete(model, extra_body={"lora": [{"name": "rnd"}]}) == adapted)
status, gone = admin("DELETE", "/admin/lora-adapters/rnd")
check("DELETE /admin/lora-adapters/rnd", status == 200 and gone["unloaded"], gone)
try:
    complete(f"{model}:rnd")
    check("an unloaded adapter raises", False)
except openai.BadRequestError as e:
    check("an unloaded adapter -> BadRequestError", e.status_code == 400, e)
done()
