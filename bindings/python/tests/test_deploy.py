"""The deployment files: the Kubernetes manifests validate against the Kubernetes API's
schemas (``kubernetes-validate``, strict: unknown fields are errors) and lint clean
(``yamllint``); the Dockerfile's build steps work on exactly the files its COPY steps
take (after .dockerignore). (The Ray Serve config is checked in test_ray.py, with Ray.)

Docker itself is not needed (nor available on the test machines): the Dockerfile's stages
are read, their build contexts copied as COPY would, and their cargo steps resolved there
with ``cargo metadata --locked --offline`` (everything those steps need: the workspace,
the lock file, the package and binary they name)."""

from __future__ import annotations

import fnmatch
import json
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

K8S = REPO / "deploy" / "kubernetes"
VENV_BIN = pathlib.Path(sys.executable).parent


def manifests():
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_kubernetes_manifest_validates(path):
    # 1.30: the oldest version the manifests rely on (preStop sleep).
    out = subprocess.run([str(VENV_BIN / "kubernetes-validate"), "--strict", "-k", "1.30.0",
                          str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kubernetes_yaml_lints():
    config = "{extends: default, rules: {line-length: {max: 100}, document-start: disable}}"
    files = [str(p) for p in sorted(K8S.rglob("*.yaml"))]
    files += [str(REPO / "deploy/ray/serve-config.yaml")]
    out = subprocess.run([str(VENV_BIN / "yamllint"), "-s", "-d", config, *files],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kustomization_lists_every_manifest():
    for kust in K8S.rglob("kustomization.yaml"):
        listed = set(yaml.safe_load(kust.read_text())["resources"])
        present = {p.name for p in kust.parent.glob("*.yaml") if p.name != kust.name}
        assert listed == present, kust


def test_hpa_scales_the_deployment_on_queue_depth():
    docs = {d["kind"]: d for p in (K8S / "scale-out").glob("*.yaml")
            for d in yaml.safe_load_all(p.read_text()) if d and "kind" in d}
    hpa, dep = docs["HorizontalPodAutoscaler"], docs["Deployment"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "mica_queue_depth"
    rules = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])["rules"]
    assert rules[0]["name"]["as"] == "mica_queue_depth"
    # The metric the adapter publishes is one mica's /metrics exposes.
    metrics_src = (REPO / "crates/mica-engine/src/metrics.rs").read_text()
    assert '"mica_queue_depth"' in metrics_src
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]} == {
        "/ready", "/health"}
    grace = int(c["args"][c["args"].index("--shutdown-grace") + 1].rstrip("s"))
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > grace + pre_stop


def test_deployment_container_serves(tmp_path, smol_path, mica_bin):
    """The Deployment's container command, run as the pod would run it (the model volume a
    temporary folder, a free port, the key from the Secret): `mica serve` accepts every
    flag, the startup and readiness probes' routes answer without a key once the model is
    loaded, Prometheus can scrape `mica_queue_depth` without a key, the API needs the key,
    and SIGTERM drains and exits cleanly within the pod's grace period."""
    import signal
    import socket
    import time
    import urllib.error
    import urllib.request

    dep = yaml.safe_load((K8S / "scale-out" / "deployment.yaml").read_text())
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    models = tmp_path / "models"
    models.mkdir()
    (models / "model.gguf").symlink_to(smol_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    key = "test-key"
    mount = c["volumeMounts"][0]["mountPath"]
    args = []
    for a in c["args"]:
        a = a.replace("$(MICA_API_KEY)", key).replace(mount, str(models))
        args.append(a)
    # The machine's resources, not the pod's: one thread and a small KV cache.
    args[args.index("--port") + 1] = str(port)
    args[args.index("--threads") + 1] = "1"
    args[args.index("--kv-mem") + 1] = "64M"
    container_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert c["args"][c["args"].index("--port") + 1] == str(container_port)
    proc = subprocess.Popen([str(mica_bin), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"

    def get(path, auth=False):
        req = urllib.request.Request(base + path)
        if auth:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, _ = get(c["readinessProbe"]["httpGet"]["path"])
            except OSError:
                status = None
            if status == 200:
                break
            time.sleep(0.2)
        assert status == 200, f"never ready: {status}; {proc.poll()}"
        assert get(c["startupProbe"]["httpGet"]["path"])[0] == 200
        assert get(c["livenessProbe"]["httpGet"]["path"])[0] == 200
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(container_port)
        code, text = get(annotations["prometheus.io/path"])
        assert code == 200 and "mica_queue_depth" in text, text[:500]
        assert get("/v1/models")[0] == 401
        code, body = get("/v1/models", auth=True)
        assert code == 200 and json.loads(body)["data"][0]["id"] == "model"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=pod["terminationGracePeriodSeconds"])
        assert rc == 0, proc.stdout.read()
        assert time.monotonic() - t0 < pod["terminationGracePeriodSeconds"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- Dockerfile ------------------------------------------------------------------------


def dockerfile_stages():
    """``{stage: [(instruction, args), ...]}``, continuation lines joined."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    stages, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            parts = args.split()
            current = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else parts[0]
            stages[current] = []
        elif current is not None:
            stages[current].append((instr, args.strip()))
    return stages


def dockerignored(rel: str, patterns) -> bool:
    """Whether .dockerignore's ``patterns`` exclude ``rel``: a pattern matches the path or
    one of its parent directories; ``**/`` matches at any depth (Docker's rules for the
    patterns this repository uses)."""
    parts = pathlib.PurePosixPath(rel).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        if pat.startswith("**/"):
            tail = pat[3:]
            if any(fnmatch.fnmatch(part, tail) for part in parts):
                return True
        elif any(fnmatch.fnmatch(pre, pat) for pre in prefixes):
            return True
    return False


def copy_context(stage, dest: pathlib.Path):
    """Copies what the stage's COPY steps take from the build context into ``dest``."""
    ignore = [l.strip() for l in (REPO / ".dockerignore").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    for instr, args in stage:
        if instr != "COPY" or args.startswith("--from"):
            continue
        *srcs, dst = args.split()
        for src in srcs:
            path = REPO / src
            assert path.exists(), f"COPY {src}: not in the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for f in files:
                rel = f.relative_to(REPO).as_posix()
                if dockerignored(rel, ignore):
                    continue
                # The repository's COPY steps keep paths as they are in the context.
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)


def cargo_metadata(cwd: pathlib.Path, manifest: str = "Cargo.toml") -> dict:
    out = subprocess.run(["cargo", "metadata", "--locked", "--offline", "--format-version",
                          "1", "--manifest-path", manifest], cwd=cwd, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_dockerignore_keeps_build_outputs_and_models_out():
    ignore = [l.strip() for l in (REPO / ".dockerignore").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    for rel in ["target/debug/mica", "bindings/python/target/x", "models/m.gguf",
                "bindings/python/.venv/bin/python", "crates/mica/x.gguf"]:
        assert dockerignored(rel, ignore), rel
    for rel in ["crates/mica/src/lib.rs", "Cargo.lock", "bindings/python/src/lib.rs"]:
        assert not dockerignored(rel, ignore), rel


def test_docker_build_stage_resolves(tmp_path):
    stages = dockerfile_stages()
    assert list(stages)[-1] == "server", "the default target must be the server"
    copy_context(stages["build"], tmp_path)
    runs = [a for i, a in stages["build"] if i == "RUN"]
    cargo = shlex.split(next(r for r in runs if r.startswith("cargo build")).split("&&")[0])
    pkg, binary = cargo[cargo.index("-p") + 1], cargo[cargo.index("--bin") + 1]
    assert "--locked" in cargo and "--release" in cargo
    meta = cargo_metadata(tmp_path)
    member = next(p for p in meta["packages"] if p["name"] == pkg)
    assert member["id"] in meta["workspace_members"]
    assert any(t["name"] == binary and "bin" in t["kind"] for t in member["targets"])
    # The server stage copies what the build stage installed.
    built = next(r for r in runs if "install" in r).split()[-1]
    copies = [a for i, a in stages["server"] if i == "COPY" and a.startswith("--from=build")]
    assert copies and copies[0].split()[1] == built


def test_docker_wheel_stage_resolves(tmp_path):
    stages = dockerfile_stages()
    copy_context(stages["wheel"], tmp_path)
    meta = cargo_metadata(tmp_path / "bindings/python")
    assert any(p["name"] == "mica-python" for p in meta["packages"])
    assert (tmp_path / "bindings/python/pyproject.toml").is_file()
    ray_copies = [a.split() for i, a in stages["ray"] if i == "COPY" and "--from" not in a]
    for src, _dst in ray_copies:
        assert (REPO / src).exists(), src
