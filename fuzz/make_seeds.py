#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/seeds/<target>/) from the repository's
fixtures: small files only, so libFuzzer's inputs stay short. Run from anywhere; needs a
built `mica` binary for the `.mica` seeds (target/debug/mica, or $MICA_BIN).

Seeds: a tiny GGUF with every metadata type and three tensors, and the header region of a
real fixture; the same as `.mica` files (converted by `mica convert`); a tiny safetensors
file and the header region of a fixture's; the tokenizer.json fixtures and a minimal
byte-level one; the chat templates of the tokenizer fixtures plus ChatML; hand-written
request bodies of both APIs."""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")


def out(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def tiny_gguf():
    """GGUF v3: one key of each value type, three tensors (f32, f16, q8_0)."""
    kv = []

    def key(name, vtype, payload):
        kv.append(gguf_string(name) + struct.pack("<I", vtype) + payload)

    key("general.architecture", 8, gguf_string("llama"))
    key("t.u8", 0, struct.pack("<B", 7))
    key("t.i8", 1, struct.pack("<b", -7))
    key("t.u16", 2, struct.pack("<H", 700))
    key("t.i16", 3, struct.pack("<h", -700))
    key("t.u32", 4, struct.pack("<I", 70000))
    key("t.i32", 5, struct.pack("<i", -70000))
    key("t.f32", 6, struct.pack("<f", 0.5))
    key("t.bool", 7, struct.pack("<B", 1))
    key("t.u64", 10, struct.pack("<Q", 1 << 40))
    key("t.i64", 11, struct.pack("<q", -(1 << 40)))
    key("t.f64", 12, struct.pack("<d", 0.25))
    key("t.arr_u32", 9, struct.pack("<IQ", 4, 3) + struct.pack("<3I", 1, 2, 3))
    key("t.arr_str", 9, struct.pack("<IQ", 8, 2) + gguf_string("a") + gguf_string("bc"))
    key("general.alignment", 4, struct.pack("<I", 32))
    # (name, dims, ggml type, bytes)
    tensors = [
        ("a.weight", [4], 0, struct.pack("<4f", 1, 2, 3, 4)),
        ("b.weight", [3, 2], 1, struct.pack("<6e", 1, 2, 3, 4, 5, 6)),
        ("c.weight", [32], 8, struct.pack("<e", 0.1) + bytes(range(32))),
    ]
    infos, data = [], b""
    for name, dims, t, payload in tensors:
        while len(data) % 32:
            data += b"\0"
        infos.append(gguf_string(name) + struct.pack("<I", len(dims))
                     + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", t, len(data)))
        data += payload
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    while len(head) % 32:
        head += b"\0"
    return head + data


def tiny_safetensors():
    header = {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "F16", "shape": [3], "data_offsets": [16, 22]},
        "c": {"dtype": "BF16", "shape": [1, 1], "data_offsets": [22, 24]},
    }
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + struct.pack("<4f", 1, 2, 3, 4) + bytes(8)


def byte_level_tokenizer():
    chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [chr(256 + n) for n in range(33)]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab["Ġt"] = len(vocab)
    return json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "special": True}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": ["Ġ t"]},
    })


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def gguf_chat_template(path):
    """`tokenizer.chat_template` of a GGUF file, read from its header (None if absent)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return None
        _, _, n_kv = struct.unpack("<IQQ", f.read(20))
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t in sizes:
                f.seek(sizes[t], 1)
            elif t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)

        for _ in range(n_kv):
            k = string().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if k == "tokenizer.chat_template" and t == 8:
                return string().decode()
            skip(t)
    return None


def main():
    if os.path.isdir(SEEDS):
        shutil.rmtree(SEEDS)
    g = tiny_gguf()
    out("gguf", "tiny", g)  # (no .gguf extension: the repository ignores *.gguf outside fixtures/)
    fixture = os.path.join(ROOT, "fixtures/converted/mixtral/model.q8_0.gguf")
    with open(fixture, "rb") as f:
        real = f.read()
    out("gguf", "mixtral-head", real[:16384])

    mica = os.environ.get("MICA_BIN", os.path.join(ROOT, "target/debug/mica"))
    with tempfile.TemporaryDirectory() as tmp:
        dst = os.path.join(tmp, "m.mica")
        subprocess.run([mica, "convert", fixture, "-o", dst, "--quiet"], check=True)
        with open(dst, "rb") as f:
            m = f.read()
    out("mica", "mixtral.mica", m)
    out("mica", "mixtral-head.mica", m[:8192])

    out("safetensors", "tiny.safetensors", tiny_safetensors())
    with open(os.path.join(ROOT, "fixtures/hf/llama/model.safetensors"), "rb") as f:
        st = f.read()
    n = struct.unpack("<Q", st[:8])[0]
    out("safetensors", "llama-head.safetensors", st[: 8 + n + 64])

    for name in ["state_dict.pt", "wrapped.pt", "noncontiguous.pt", "legacy.pt",
                 "evil/os_system.pt", "evil/eval.pt", "evil/inst.pt"]:
        with open(os.path.join(ROOT, "fixtures/pytorch", name), "rb") as f:
            out("pytorch", name.replace("/", "-"), f.read())

    out("tokenizer_json", "byte-level.json", byte_level_tokenizer())
    templates = {"chatml.jinja": CHATML}
    for name in sorted(os.listdir(os.path.join(ROOT, "fixtures/tokenizers"))):
        d = os.path.join(ROOT, "fixtures/tokenizers", name)
        if not os.path.isdir(d):
            continue
        with open(os.path.join(d, "tokenizer.json"), "rb") as f:
            out("tokenizer_json", f"{name}.json", f.read())
        cfg_path = os.path.join(d, "tokenizer_config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                t = json.load(f).get("chat_template")
            if isinstance(t, str):
                templates[f"{name}.jinja"] = t
    # The templates of the test models, when they are here (scripts/fetch-test-models).
    models = os.environ.get("MICA_TEST_MODELS", os.path.join(ROOT, "models"))
    if os.path.isdir(models):
        for name in sorted(os.listdir(models)):
            if name.endswith(".gguf"):
                t = gguf_chat_template(os.path.join(models, name))
                if t:
                    templates[name[: -len(".gguf")] + ".jinja"] = t
    for name, t in templates.items():
        out("chat_template", name, t)

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    openai = [
        {"model": "m", "messages": msgs, "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["\n"],
         "seed": 1, "stream": True, "stream_options": {"include_usage": True}},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
         "logprobs": True, "top_logprobs": 3, "n": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5},
        {"model": "m", "prompt": "Once upon", "max_tokens": 4, "logprobs": 2, "top_k": 40, "min_p": 0.05},
        {"model": "m", "prompt": [1, 2, 3], "max_completion_tokens": 2, "repeat_penalty": 1.1,
         "repeat_last_n": -1, "priority": "bulk"},
        {"model": "m", "prompt": ["one"], "stop": "x"},
    ]
    for i, b in enumerate(openai):
        out("openai_request", f"body{i}.json", json.dumps(b))
    ollama = [
        {"model": "m", "prompt": "Why?", "system": "Be brief.", "stream": False,
         "options": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "num_predict": 8, "num_ctx": 2048,
                     "seed": 3, "stop": ["\n"], "repeat_penalty": 1.1, "repeat_last_n": 64}},
        {"model": "m", "prompt": "raw", "raw": True, "options": {"num_predict": -1, "min_p": 0.1}},
        {"model": "m", "messages": msgs, "options": {"presence_penalty": 1, "frequency_penalty": 1}},
        {"model": "m", "messages": [], "priority": "background"},
    ]
    for i, b in enumerate(ollama):
        out("ollama_request", f"body{i}.json", json.dumps(b))
    anthropic = [
        {"model": "m", "max_tokens": 8, "system": "Be brief.", "stream": True, "temperature": 0.7,
         "top_p": 0.9, "top_k": 40, "stop_sequences": ["\n"], "metadata": {"user_id": "u"},
         "messages": [{"role": "user", "content": "Hi"}]},
        {"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
         "tools": [{"name": "get_weather", "description": "Weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
         "tool_choice": {"type": "tool", "name": "get_weather"},
         "messages": [{"role": "user", "content": [{"type": "text", "text": "Paris?"}]},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                                         "name": "get_weather", "input": {"city": "Paris"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                    "content": [{"type": "text", "text": "21 C"}]}]}]},
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    ]
    for i, b in enumerate(anthropic):
        out("anthropic_request", f"body{i}.json", json.dumps(b))
    total = sum(len(fs) for _, _, fs in os.walk(SEEDS))
    print(f"wrote {total} seeds under {SEEDS}")


if __name__ == "__main__":
    sys.exit(main())
