#!/usr/bin/env python3
"""Charts of benchmark results, drawn with matplotlib (SVG or PNG by the output's extension).

  compare JSON OUT        `bench/compare --json` output: tokens/s of mica and llama.cpp per
                          model and test (bars with the runs' standard deviation, ratio on
                          top), one panel per thread count; with several thread counts a
                          second row plots tokens/s against threads per model and test.
  serve-load JSON... OUT  `bench/serve_load.py mixed --json-out` files (one per scheduler,
                          e.g. fifo and priority): time to first token of every request
                          against when it was sent, per lane, one panel per file.

Run it with a Python that has matplotlib; `--setup` installs matplotlib into bench/.venv
(the virtual environment bench/compare creates) and re-runs there:
  python3 bench/charts.py --setup compare out.json docs/compare.svg
`bench/compare --chart FILE` and `bench/serve_load.py --chart FILE` call it themselves.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV_PY = HERE / ".venv" / "bin" / "python"


def setup_and_rerun(argv):
    """Installs matplotlib into bench/.venv (creating it if needed) and runs this script
    there with `argv`."""
    if not VENV_PY.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HERE / ".venv")], check=True)
    have = subprocess.run([str(VENV_PY), "-c", "import matplotlib"], capture_output=True)
    if have.returncode != 0:
        subprocess.run([str(VENV_PY), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "matplotlib"], check=True)
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *argv])


def plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as p
    p.rcParams.update({"svg.fonttype": "none", "font.size": 9})
    return p


def short_model(r):
    name = Path(r.get("model_filename") or r["model"]).stem
    return name.replace("-instruct", "").replace("-awq", "")


def compare_chart(data, out):
    p = plt()
    rows = [r for r in data["results"] if r["mica"].get("avg_ts") and r["llama_cpp"].get("avg_ts")]
    if not rows:
        raise SystemExit("charts.py compare: no test has numbers for both engines")
    threads = sorted({r["n_threads"] for r in rows})
    multi = len(threads) > 1
    fig, axes = p.subplots(2 if multi else 1, len(threads), squeeze=False,
                           figsize=(max(6, 4.5 * len(threads)), 7.5 if multi else 4.2))
    for col, t in enumerate(threads):
        ax = axes[0][col]
        rs = [r for r in rows if r["n_threads"] == t]
        labels = [f"{short_model(r)}\n{r['test']}" for r in rs]
        x = range(len(rs))
        w = 0.38
        m = [r["mica"]["avg_ts"] for r in rs]
        ms = [r["mica"].get("stddev_ts", 0) for r in rs]
        l = [r["llama_cpp"]["avg_ts"] for r in rs]
        ls = [r["llama_cpp"].get("stddev_ts", 0) for r in rs]
        ax.bar([i - w / 2 for i in x], m, w, yerr=ms, label="mica", color="#2b6cb0", capsize=2)
        ax.bar([i + w / 2 for i in x], l, w, yerr=ls, label="llama.cpp", color="#a0aec0", capsize=2)
        for i, r in enumerate(rs):
            ax.annotate(f"{r['mica']['avg_ts'] / r['llama_cpp']['avg_ts']:.2f}×",
                        (i, max(m[i] + ms[i], l[i] + ls[i])), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), labels, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("tokens/s (log scale)")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}")
        ax.legend(fontsize=8)
    if multi:
        for col in range(len(threads)):
            axes[1][col].axis("off")
        ax = fig.add_subplot(2, 1, 2)
        keys = sorted({(short_model(r), r["test"]) for r in rows})
        for k in keys:
            rs = sorted((r for r in rows if (short_model(r), r["test"]) == k), key=lambda r: r["n_threads"])
            if len(rs) < 2:
                continue
            ts = [r["n_threads"] for r in rs]
            line, = ax.plot(ts, [r["mica"]["avg_ts"] for r in rs], marker="o", label=f"{k[0]} {k[1]} mica")
            ax.plot(ts, [r["llama_cpp"]["avg_ts"] for r in rs], marker="x", linestyle="--",
                    color=line.get_color(), label=f"{k[0]} {k[1]} llama.cpp")
        ax.set_xlabel("threads")
        ax.set_ylabel("tokens/s")
        ax.set_yscale("log")
        ax.set_xticks(threads)
        ax.legend(fontsize=6, ncol=2)
        ax.set_title("tokens/s against threads (solid: mica, dashed: llama.cpp)")
    cpu = data.get("cpu", "")
    fig.suptitle(f"mica vs llama.cpp, same GGUF — {cpu}, mica's kernels: {data.get('mica_isa', '?')}\n"
                 f"mica {data.get('mica_commit', '')[:80]}, llama.cpp {data.get('llama_cpp_python', '?')}"
                 f" (llama-cpp-python), {data.get('reps', '?')} alternating runs each", fontsize=9)
    fig.tight_layout()
    fig.savefig(out)


def serve_load_chart(datas, out):
    p = plt()
    fig, axes = p.subplots(1, len(datas), squeeze=False, sharey=True, figsize=(5 * len(datas), 4))
    colors = {"bulk": "#a0aec0", "interactive": "#c53030", "idle": "#2f855a"}
    for ax, d in zip(axes[0], datas):
        reqs = d.get("requests")
        if not reqs:
            raise SystemExit("charts.py serve-load: the file has no per-request timeline "
                             "(run serve_load.py mixed with --json-out)")
        for lane in ["idle", "bulk", "interactive"]:
            pts = [(q["sent_s"], q["ttft_s"]) for q in reqs if q["lane"] == lane and q["ttft_s"] is not None]
            if pts:
                ax.scatter([a for a, _ in pts], [b for _, b in pts], label=lane, color=colors[lane],
                           s=28, marker="s" if lane == "bulk" else "o")
        ax.set_title(f"scheduler: {d.get('scheduler', '?')}")
        ax.set_xlabel("request sent at (s)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("time to first token (s, log scale)")
    fig.suptitle("mica serve: interactive requests behind 3 long bulk ones "
                 "(idle = the same burst on the idle server first)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out)


def main(argv):
    if argv and argv[0] == "--setup":
        setup_and_rerun(argv[1:])
    if len(argv) < 3 or argv[0] not in ("compare", "serve-load"):
        raise SystemExit(__doc__)
    out = argv[-1]
    datas = [json.loads(Path(f).read_text()) for f in argv[1:-1]]
    if argv[0] == "compare":
        compare_chart(datas[0], out)
    else:
        serve_load_chart(datas, out)
    print(f"charts.py: wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
