#!/usr/bin/env python3
"""Layer streaming under a real memory limit (not a CI test; run as root).

Runs `mica run` on a model inside a memory cgroup limited well below the model's size,
three ways: plain (the whole model mapped, `--force` so that mica neither refuses nor
streams), streamed overlapped and streamed sync (`--mem-budget`), and reports for each
whether it completed, its peak RSS, the cgroup's peak charge (page cache included) and
how often the cgroup hit its limit, plus prompt and generation speed.

The cgroup is made by the first of these that works here, and the report says which:
  1. `systemd-run --scope -p MemoryMax=…` (needs systemd as PID 1);
  2. a cgroup v2 folder with `memory.max` (needs the memory controller in cgroup v2);
  3. a cgroup v1 memory folder with `memory.limit_in_bytes` (hybrid hierarchies).

With `--timing R`, each way runs R more times, the ways alternating (A/B/C/A/B/C...),
the page cache dropped before every run (`echo 3 > /proc/sys/vm/drop_caches`) where
allowed; medians and spread are printed. Only time on a quiet machine.

    python3 bench/stream_residency.py --model models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf \\
        --limit 192M --budget 160M [--timing 3]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid


def size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)(?:i?B)?", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"cannot read size {s!r} (try 192M)")
    mul = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(float(m.group(1)) * mul)


def mib(b):
    return f"{b / (1 << 20):.1f} MiB"


def own_cgroup(controller):
    """This process's cgroup path for a v1 `controller` ('' for v2)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if (controller and controller in ctrls.split(",")) or (not controller and ctrls == ""):
                return path
    return None


class Cgroup:
    """A memory-limited cgroup to run commands in; `kind` says how it was made."""

    def __init__(self, limit):
        self.limit = limit
        self.kind = None
        self.path = None
        self.notes = []
        for make in (self._systemd, self._v2, self._v1):
            try:
                if make():
                    return
            except OSError as e:
                self.notes.append(f"{make.__name__}: {e}")
        raise SystemExit("no way to make a memory cgroup here:\n  " + "\n  ".join(self.notes))

    def _systemd(self):
        if not shutil.which("systemd-run"):
            self.notes.append("systemd-run: not installed")
            return False
        r = subprocess.run(["systemd-run", "--scope", "-q", "-p", f"MemoryMax={self.limit}", "true"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.notes.append("systemd-run --scope: " + (r.stderr.strip().splitlines() or ["failed"])[0])
            return False
        self.kind = "systemd-run --scope -p MemoryMax"
        return True

    def _v2(self):
        for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            ctrl = os.path.join(root, "cgroup.controllers")
            if not os.path.exists(ctrl):
                continue
            if "memory" not in open(ctrl).read().split():
                self.notes.append(f"cgroup v2 at {root}: no memory controller")
                continue
            base = os.path.join(root, (own_cgroup("") or "/").lstrip("/"))
            path = os.path.join(base, f"mica-stream-{uuid.uuid4().hex[:8]}")
            os.mkdir(path)
            with open(os.path.join(path, "memory.max"), "w") as f:
                f.write(str(self.limit))
            with open(os.path.join(path, "memory.swap.max"), "w") as f:
                f.write("0")
            self.kind, self.path = f"cgroup v2 memory.max ({path})", path
            return True
        return False

    def _v1(self):
        root = "/sys/fs/cgroup/memory"
        if not os.path.isdir(root):
            self.notes.append("cgroup v1: no memory hierarchy")
            return False
        base = os.path.join(root, (own_cgroup("memory") or "/").lstrip("/"))
        path = os.path.join(base, f"mica-stream-{uuid.uuid4().hex[:8]}")
        os.mkdir(path)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(self.limit))
        sw = os.path.join(path, "memory.memsw.limit_in_bytes")
        if os.path.exists(sw):
            with open(sw, "w") as f:
                f.write(str(self.limit))
        self.kind, self.path = f"cgroup v1 memory.limit_in_bytes ({path})", path
        return True

    def _read(self, name):
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read()
        except OSError:
            return None

    def reset(self):
        if self.path and self.kind.startswith("cgroup v1"):
            for name in ("memory.max_usage_in_bytes", "memory.failcnt"):
                try:
                    with open(os.path.join(self.path, name), "w") as f:
                        f.write("0")
                except OSError:
                    pass

    def stats(self):
        """(peak bytes, times the limit was hit, OOM kills) where the cgroup says."""
        if not self.path:
            return None, None, None
        if self.kind.startswith("cgroup v1"):
            peak = self._read("memory.max_usage_in_bytes")
            fails = self._read("memory.failcnt")
            oom = re.search(r"oom_kill (\d+)", self._read("memory.oom_control") or "")
            return (int(peak) if peak else None, int(fails) if fails else None,
                    int(oom.group(1)) if oom else None)
        peak = self._read("memory.peak")
        ev = self._read("memory.events") or ""
        hits = re.search(r"^max (\d+)", ev, re.M)
        oom = re.search(r"^oom_kill (\d+)", ev, re.M)
        return (int(peak) if peak else None, int(hits.group(1)) if hits else None,
                int(oom.group(1)) if oom else None)

    def command(self, cmd):
        if self.kind.startswith("systemd"):
            return ["systemd-run", "--scope", "-q", "-p", f"MemoryMax={self.limit}", "-p", "MemorySwapMax=0"] + cmd
        return cmd

    def enter(self):
        """preexec_fn: moves the child into the cgroup."""
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def remove(self):
        if self.path:
            if self.kind.startswith("cgroup v1"):
                try:
                    with open(os.path.join(self.path, "memory.force_empty"), "w") as f:
                        f.write("0")
                except OSError:
                    pass
            try:
                os.rmdir(self.path)
            except OSError:
                pass


def drop_caches():
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


SPEED = re.compile(r"prompt (\d+) tok, ([\d.]+) tok/s \| generation (\d+) tok, ([\d.]+) tok/s")


def run_once(args, extra):
    """One run in a fresh cgroup (a killed run's page cache stays charged to its cgroup)."""
    cg = Cgroup(args.limit)
    try:
        return run_in(cg, args, extra)
    finally:
        cg.remove()


def run_in(cg, args, extra):
    cmd = [args.mica, "run", "-m", args.model, "-p", args.prompt, "-n", str(args.n), "--temp", "0",
           "-c", str(args.ctx), "-t", str(args.threads)] + extra
    cg.reset()
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen(cg.command(cmd), stdout=fo, stderr=fe, preexec_fn=cg.enter,
                             env=dict(os.environ, MICA_LOG="info"))
        # wait4 gives this child's own peak RSS (ru_maxrss, KiB).
        timed_out, status, usage = False, None, None
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > args.timeout:
                p.kill()
                _, status, usage = os.wait4(p.pid, 0)
                timed_out = True
                break
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    rss = usage.ru_maxrss * 1024 if usage else None
    peak, hits, oom = cg.stats()
    speed = SPEED.search(err.decode(errors="replace"))
    return {
        "ok": p.returncode == 0 and not timed_out,
        "rc": p.returncode,
        "timed_out": timed_out,
        "wall": wall,
        "rss": rss,
        "peak": peak,
        "hits": hits,
        "oom": oom,
        "prompt_tps": float(speed.group(2)) if speed else None,
        "gen_tps": float(speed.group(4)) if speed else None,
        "out": out.decode(errors="replace"),
        "err": err.decode(errors="replace"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mica", default="target/release/mica")
    ap.add_argument("--model", required=True)
    ap.add_argument("--limit", type=size, required=True, help="the cgroup's memory limit")
    ap.add_argument("--budget", default=None, help="--mem-budget for the streamed runs (default: the limit)")
    ap.add_argument("--prompt", default="def quicksort(arr):")
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--timing", type=int, default=0, help="timed repetitions of each way")
    args = ap.parse_args()
    budget = args.budget or f"{args.limit >> 20}M"

    cg = Cgroup(args.limit)
    cg.remove()
    print(f"model {args.model} ({mib(os.path.getsize(args.model))}), limit {mib(args.limit)}, "
          f"--mem-budget {budget}")
    print(f"cgroup: {cg.kind}")
    for n in cg.notes:
        print(f"  (not used: {n})")
    ways = {
        "plain mmap (--force)": ["--force"],
        "streamed overlapped": ["--mem-budget", budget, "--stream-mode", "overlapped"],
        "streamed sync": ["--mem-budget", budget, "--stream-mode", "sync"],
    }
    results = {}
    for name, extra in ways.items():
        drop_caches()
        r = run_once(args, extra)
        results[name] = r
        status = "completed" if r["ok"] else ("timed out" if r["timed_out"] else f"failed (exit {r['rc']})")
        print(f"\n{name}: {status} in {r['wall']:.1f} s")
        print(f"  peak RSS {mib(r['rss']) if r['rss'] else '?'}, cgroup peak "
              f"{mib(r['peak']) if r['peak'] else '?'}, limit hit {r['hits']} times, OOM kills {r['oom']}")
        if r["prompt_tps"] is not None:
            print(f"  prompt {r['prompt_tps']} tok/s, generation {r['gen_tps']} tok/s")
        for line in r["err"].splitlines():
            if "streaming" in line or "error" in line or "memory after" in line:
                print("  " + line.strip())
    outs = {n: r["out"] for n, r in results.items() if r["ok"]}
    if len(set(outs.values())) > 1:
        print("\nWARNING: the completed runs' outputs differ")
    elif outs:
        print(f"\nthe {len(outs)} completed runs printed the same text")
    if args.timing:
        dropped = drop_caches()
        print(f"\ntiming: {args.timing} runs of each, alternating; page cache "
              f"{'dropped before each run' if dropped else 'NOT dropped (not allowed)'}")
        times = {n: [] for n in ways}
        for _ in range(args.timing):
            for name, extra in ways.items():
                drop_caches()
                r = run_once(args, extra)
                if r["ok"]:
                    times[name].append((r["prompt_tps"], r["gen_tps"]))
        for name, ts in times.items():
            if not ts:
                print(f"  {name}: no completed run")
                continue
            p = [t[0] for t in ts]
            g = [t[1] for t in ts]
            print(f"  {name}: prompt median {statistics.median(p):.1f} tok/s "
                  f"({min(p):.1f}-{max(p):.1f}), generation median {statistics.median(g):.2f} tok/s "
                  f"({min(g):.2f}-{max(g):.2f}), {len(ts)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
