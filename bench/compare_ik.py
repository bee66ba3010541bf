"""ik_llama.cpp as a second peer in bench/compare: one measurement through its llama-bench.

The binary is what bench/build-ik-llama builds (bench/.ik_llama/build/bin/llama-bench, with
bench/.ik_llama/stamp.json recording the commit and flags), or any ik_llama.cpp llama-bench.
Each call is one fresh process, like the other two engines: load (with run-time repacking,
`-rtr 1`, and flash attention, `-fa 1`), one warm-up, one timed run:

  - pp N: `-p N -n 0 -r 2`, the first run being the warm-up (the whole prompt, as the
    llama.cpp side warms up) and dropped;
  - tg N: `-p 0 -n N -r 1` after llama-bench's own warm-up (one token, as the llama.cpp side);
  - tg N at depth D: `-gp D,N` (a D-token prompt, untimed, then N timed decode steps; ik's
    llama-bench has no `-d`); pp N at depth D has no equivalent and is reported unsupported.

KV cache types go through `-ctk/-ctv`. The result is a dict with Side's fields.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

IK_DIR = Path(__file__).resolve().parent / ".ik_llama"
DEFAULT_BINARY = IK_DIR / "build" / "bin" / "llama-bench"
FIXED_ARGS = ["-rtr", "1", "-fa", "1"]


def stamp(binary: Path) -> dict | None:
    """bench/build-ik-llama's record (commit, flags) for a binary it built, else None."""
    try:
        p = binary.resolve().parents[2] / "stamp.json"
        return json.loads(p.read_text()) if p.is_file() else None
    except (IndexError, OSError, ValueError):
        return None


def describe(binary: Path) -> str:
    """One line for the table's footer: which ik_llama.cpp, built how."""
    s = stamp(binary)
    if s is None:
        return f"ik_llama.cpp {binary} (no build stamp) with {' '.join(FIXED_ARGS)}"
    isa = [f.removeprefix("-D").removesuffix("=ON") for f in s.get("cmake_flags", [])
           if f.startswith("-DGGML_") and f.endswith("=ON")]
    extra = next((f.split("=", 1)[1] for f in s.get("cmake_flags", []) if f.startswith("-DCMAKE_C_FLAGS=")), "")
    return (f"ik_llama.cpp {s.get('commit', '?')[:12]} ({', '.join(isa) or 'default ISA'}"
            f"{'; ' + extra if extra else ''}) with {' '.join(FIXED_ARGS)}")


def command(binary: Path, model: Path, threads: int, n_prompt: int, n_gen: int,
            depth: int, ctk: str, ctv: str) -> tuple[list[str], bool] | str:
    """(argv, whether the first sample is a warm-up to drop), or why the test has no equivalent."""
    cmd = [str(binary), "-m", str(model), "-t", str(threads), *FIXED_ARGS,
           "-ctk", ctk, "-ctv", ctv, "-o", "json"]
    if n_prompt > 0 and n_gen == 0:
        if depth > 0:
            return "ik_llama.cpp's llama-bench has no depth (-d) for prompt tests"
        return cmd + ["-p", str(n_prompt), "-n", "0", "-r", "2"], True
    if n_gen > 0 and n_prompt == 0:
        if depth > 0:
            return cmd + ["-p", "0", "-n", "0", "-gp", f"{depth},{n_gen}", "-r", "1"], False
        return cmd + ["-p", "0", "-n", str(n_gen), "-r", "1"], False
    raise ValueError(f"a test is either pp or tg, not n_prompt={n_prompt} n_gen={n_gen}")


def run_ik(binary: Path, model: Path, threads: int, n_prompt: int, n_gen: int,
           depth: int, ctk: str, ctv: str) -> dict:
    """One fresh ik_llama.cpp llama-bench process; returns Side's fields as a dict."""
    c = command(binary, model, threads, n_prompt, n_gen, depth, ctk, ctv)
    if isinstance(c, str):
        return {"status": "unsupported", "message": c}
    cmd, drop_first = c
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, wstatus, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wstatus)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        if proc.returncode == -signal.SIGILL:
            msg = ("killed by SIGILL: ik_llama.cpp was built for instructions this CPU refuses; "
                   "rebuild it with bench/build-ik-llama")
        else:
            lines = [ln for ln in stderr.strip().splitlines() if "error" in ln.lower()] \
                or stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
            msg = lines[-1].strip()
        return {"status": "error", "message": msg}
    try:
        rec = json.loads(stdout)[0]
        samples_ns = rec["samples_ns"]
    except (ValueError, IndexError, KeyError, TypeError):
        return {"status": "error", "message": f"unexpected llama-bench output: {stdout[:200]!r}"}
    if drop_first:
        samples_ns = samples_ns[1:]
    n_timed = n_prompt if n_prompt > 0 else n_gen
    return {
        "status": "ok",
        "samples_ts": [1e9 * n_timed / ns for ns in samples_ns],
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # KiB on Linux
        "extra": {k: rec[k] for k in ("build_commit", "model_type", "n_batch", "n_ubatch",
                                      "type_k", "type_v", "flash_attn", "repack", "cpu_info") if k in rec},
    }
