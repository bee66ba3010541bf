"""The committed chat page (crates/mica-server/web/dist, embedded by the server) is what its
sources build to: web/build.sh records the SHA-256 of every source file and of every file it
built in dist/SOURCES.sha256, and this test recomputes them. A source edit without a rebuild,
a source added or removed, or a hand edit of dist/ fails here, without needing Node in CI
(`web/build.sh --check` rebuilds and compares byte for byte where Node is installed)."""

from __future__ import annotations

import hashlib
import pathlib

WEB = pathlib.Path(__file__).resolve().parents[2] / "crates/mica-server/web"
SOURCES = ["build.sh", "package.json", "package-lock.json", "tsconfig.json"]


def test_committed_bundle_matches_its_sources():
    stamp = {}
    for line in (WEB / "dist/SOURCES.sha256").read_text().splitlines():
        digest, name = line.split("  ", 1)
        stamp[name] = digest
    files = SOURCES + sorted(str(p.relative_to(WEB)) for p in (WEB / "src").rglob("*")
                             if p.is_file())
    files += ["dist/app.css", "dist/app.js", "dist/index.html"]
    assert sorted(stamp) == sorted(files), "sources added or removed: run web/build.sh"
    stale = [f for f in files if hashlib.sha256((WEB / f).read_bytes()).hexdigest() != stamp[f]]
    assert not stale, f"changed since web/build.sh last ran: {stale}; run web/build.sh"
