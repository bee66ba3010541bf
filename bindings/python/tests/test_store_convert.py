"""The store (names resolved as the CLI resolves them, pull with a progress callback) and
conversion from Python."""

from __future__ import annotations

import shutil

import mica


def test_store_name_resolves_like_the_cli(tmp_path, smol_path):
    shutil.copy(smol_path, tmp_path / smol_path.name)
    listed = mica.list_models(models_dir=tmp_path)
    # The store names a catalog model's file by its catalog name (as `mica list` does).
    assert [m["name"] for m in listed] == ["smollm2-135m-instruct"]
    assert listed[0]["kind"] == "gguf" and listed[0]["bytes"] == smol_path.stat().st_size
    m = mica.Model("smollm2-135m-instruct", models_dir=tmp_path, n_threads=1,
                   kv_mem=16 << 20)
    assert m.path == str(tmp_path / smol_path.name)
    assert m.name == smol_path.stem


def test_store_dir_follows_mica_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MICA_HOME", str(tmp_path))
    assert mica.store_dir() == str(tmp_path / "models")


def test_pull_reports_progress(tmp_path, smol_path):
    # The catalog model is already in place (same size): pull verifies nothing over the
    # network and says so through the callback.
    shutil.copy(smol_path, tmp_path / smol_path.name)
    events = []
    path = mica.pull("smollm2-135m-instruct", models_dir=tmp_path, progress=events.append)
    assert path == str(tmp_path / smol_path.name)
    assert events and events[0]["type"] == "status"
    assert "already in the store" in events[0]["message"]


def test_progress_callback_exception_propagates(tmp_path, smol_path):
    shutil.copy(smol_path, tmp_path / smol_path.name)

    def boom(_event):
        raise KeyError("from the callback")

    try:
        mica.pull("smollm2-135m-instruct", models_dir=tmp_path, progress=boom)
    except KeyError as e:
        assert "from the callback" in str(e)
    else:
        raise AssertionError("the callback's exception was swallowed")


def test_convert_to_mica_keeps_output(tmp_path, smol_path, model):
    events = []
    out = tmp_path / "smol.mica"
    report = mica.convert(smol_path, out, progress=events.append)
    assert out.is_file() and 0 < report["bytes_written"] <= out.stat().st_size
    assert report["tensors"] > 0 and report["converted"] == 0
    kinds = [e["type"] for e in events]
    assert "start" in kinds and "advance" in kinds and kinds[-1] == "finish"
    converted = mica.Model(out, n_threads=1, kv_mem=16 << 20)
    kw = dict(max_tokens=12, temperature=0)
    assert converted.generate("The capital of France is", **kw) == model.generate(
        "The capital of France is", **kw)
    assert converted.logits("Hello").tobytes() == model.logits("Hello").tobytes()
