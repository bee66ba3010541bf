"""Tests of bench/compare_ik.py and bench/build-ik-llama's flag choice (no ik_llama.cpp needed).

Run: python3 -m unittest bench/test_compare_ik.py
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import compare_ik  # noqa: E402


def load_script(name: str):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(BENCH / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


build = load_script("build-ik-llama")


def fake_bench(tmp: Path, body: str) -> Path:
    """An executable standing in for llama-bench."""
    p = tmp / "llama-bench"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


class Command(unittest.TestCase):
    B, M = Path("/x/llama-bench"), Path("/m.gguf")

    def test_prompt_runs_twice_and_drops_the_warm_up(self):
        cmd, drop = compare_ik.command(self.B, self.M, 2, 128, 0, 0, "f16", "f16")
        self.assertTrue(drop)
        self.assertEqual(cmd[:5], ["/x/llama-bench", "-m", "/m.gguf", "-t", "2"])
        for pair in (["-rtr", "1"], ["-fa", "1"], ["-p", "128"], ["-n", "0"], ["-r", "2"], ["-o", "json"]):
            self.assertIn(pair, [cmd[i:i + 2] for i in range(len(cmd) - 1)])

    def test_gen_runs_once_after_the_builtin_warm_up(self):
        cmd, drop = compare_ik.command(self.B, self.M, 1, 0, 16, 0, "q8_0", "q8_0")
        self.assertFalse(drop)
        pairs = [cmd[i:i + 2] for i in range(len(cmd) - 1)]
        for pair in (["-p", "0"], ["-n", "16"], ["-r", "1"], ["-ctk", "q8_0"], ["-ctv", "q8_0"]):
            self.assertIn(pair, pairs)

    def test_depth_maps_gen_to_gp_and_refuses_prompt(self):
        cmd, _ = compare_ik.command(self.B, self.M, 1, 0, 32, 2048, "f16", "f16")
        self.assertIn(["-gp", "2048,32"], [cmd[i:i + 2] for i in range(len(cmd) - 1)])
        why = compare_ik.command(self.B, self.M, 1, 128, 0, 2048, "f16", "f16")
        self.assertIsInstance(why, str)
        self.assertEqual(compare_ik.run_ik(self.B, self.M, 1, 128, 0, 2048, "f16", "f16"),
                         {"status": "unsupported", "message": why})

    def test_mixed_test_is_a_bug(self):
        with self.assertRaises(ValueError):
            compare_ik.command(self.B, self.M, 1, 8, 8, 0, "f16", "f16")


class Run(unittest.TestCase):
    def test_parses_json_and_drops_the_warm_up_sample(self):
        rec = [{"build_commit": "abc", "model_type": "llama ?B", "n_batch": 2048, "n_ubatch": 512,
                "samples_ns": [4_000_000_000, 1_000_000_000], "samples_ts": [32.0, 128.0]}]
        with tempfile.TemporaryDirectory() as d:
            b = fake_bench(Path(d), f"cat <<'EOF'\n{json.dumps(rec)}\nEOF\n")
            r = compare_ik.run_ik(b, Path("/m.gguf"), 1, 128, 0, 0, "f16", "f16")
        self.assertEqual(r["status"], "ok")
        self.assertEqual(r["samples_ts"], [128.0])
        self.assertEqual(r["extra"]["build_commit"], "abc")
        self.assertGreater(r["peak_rss_bytes"], 0)

    def test_failure_reports_the_error_line(self):
        with tempfile.TemporaryDirectory() as d:
            b = fake_bench(Path(d), "echo 'loading' >&2; echo 'main: error: failed to load model' >&2; exit 1\n")
            r = compare_ik.run_ik(b, Path("/m.gguf"), 1, 0, 8, 0, "f16", "f16")
        self.assertEqual(r, {"status": "error", "message": "main: error: failed to load model"})

    def test_garbage_output_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            b = fake_bench(Path(d), "echo 'not json'\n")
            r = compare_ik.run_ik(b, Path("/m.gguf"), 1, 0, 8, 0, "f16", "f16")
        self.assertEqual(r["status"], "error")
        self.assertIn("unexpected llama-bench output", r["message"])


class Stamp(unittest.TestCase):
    def test_describe_reads_the_build_stamp(self):
        with tempfile.TemporaryDirectory() as d:
            binary = Path(d) / "build" / "bin" / "llama-bench"
            binary.parent.mkdir(parents=True)
            binary.touch()
            self.assertIn("no build stamp", compare_ik.describe(binary))
            (Path(d) / "stamp.json").write_text(json.dumps({
                "commit": "8337e4cd3861406fc04e0854b1409cd1b027fbc9",
                "cmake_flags": ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DCMAKE_C_FLAGS=-mavx512vl"]}))
            line = compare_ik.describe(binary)
        self.assertIn("8337e4cd3861 (GGML_AVX2; -mavx512vl) with -rtr 1 -fa 1", line)


class Source(unittest.TestCase):
    """build-ik-llama's export of a bare git dir and extraction of a `git archive` tarball."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        t = Path(self.tmp.name)
        self.saved = build.CACHE, build.SRC
        build.CACHE, build.SRC = t / "cache", t / "cache" / "src"
        build.CACHE.mkdir()
        work = t / "work"
        (work / "examples" / "llama-bench").mkdir(parents=True)
        (work / "CMakeLists.txt").write_text("project(x)\n")
        (work / "examples" / "llama-bench" / "llama-bench.cpp").write_text("int main() {}\n")
        git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        subprocess.run(git + ["add", "."], check=True)
        subprocess.run(git + ["commit", "-qm", "x"], check=True)
        self.commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        self.bare = t / "bare.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(self.bare)], check=True)
        self.tar = t / "src.tar.gz"
        subprocess.run(["git", "-C", str(work), "archive", "--prefix=ik/", "-o", str(self.tar), "HEAD"], check=True)

    def tearDown(self):
        build.CACHE, build.SRC = self.saved
        self.tmp.cleanup()

    def test_bare_git_dir(self):
        self.assertEqual(build.find_gitdir(self.bare), (self.bare, True))
        self.assertEqual(build.missing_blobs(self.bare, self.commit), [])
        self.assertEqual(build.export_git(self.bare, "HEAD"), self.commit)
        self.assertTrue((build.SRC / "examples" / "llama-bench" / "llama-bench.cpp").is_file())

    def test_tarball_records_its_commit(self):
        self.assertEqual(build.extract_tarball(self.tar, None), self.commit)
        self.assertTrue((build.SRC / "CMakeLists.txt").is_file())
        self.assertEqual(build.extract_tarball(self.tar, "given"), "given")


class Flags(unittest.TestCase):
    def test_avx512_cpu_gets_explicit_flags_never_native(self):
        f = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512dq",
             "avx512cd", "avx512_vnni", "avx512_bf16", "avx512vbmi", "amx_tile", "amx_int8"}
        opts, extra = build.isa_args(f)
        self.assertIn("-DGGML_NATIVE=OFF", opts)
        for o in ("AVX2", "FMA", "F16C", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI"):
            self.assertIn(f"-DGGML_{o}=ON", opts)
        self.assertFalse(any("AMX" in o or "native" in o for o in opts + extra))
        self.assertEqual(set(extra), {"-mbmi2", "-mavx512vl", "-mavx512dq", "-mavx512cd"})

    def test_avx2_only_cpu(self):
        opts, extra = build.isa_args({"avx", "avx2", "fma", "f16c", "bmi2"})
        self.assertIn("-DGGML_AVX2=ON", opts)
        self.assertFalse(any("AVX512" in o for o in opts))
        self.assertEqual(extra, ["-mbmi2"])

    def test_no_avx_turns_the_defaults_off(self):
        opts, _ = build.isa_args(set())
        self.assertIn("-DGGML_AVX=OFF", opts)
        self.assertIn("-DGGML_AVX2=OFF", opts)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    unittest.main()
