#!/usr/bin/env bash
# Builds the chat page into dist/, which mica-server embeds in the binary (src/web.rs):
# index.html, app.js (src/*.ts with marked, DOMPurify and highlight.js, bundled and minified
# by esbuild, their license notices at the end) and app.css. Then writes dist/SOURCES.sha256,
# the hashes of the files it was built from and of what it built; tests/web/test_bundle.py
# compares them with the files, so a source edit that was not rebuilt, or a hand edit of
# dist/, fails the tests while a Rust build and CI need no Node.
#
#   web/build.sh           install the locked npm packages when needed, type-check, build
#   web/build.sh --check   build into a temporary folder and fail if dist/ differs from it
#
# Needs Node 18+ and npm.
set -euo pipefail
cd "$(dirname "$0")"
out=dist
if [ "${1:-}" = --check ]; then
    out="$(mktemp -d)"
    trap 'rm -rf "$out"' EXIT
fi
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
fi
npx --no-install tsc --noEmit -p .
mkdir -p "$out"
esbuild=(npx --no-install esbuild --bundle --minify --log-level=warning --legal-comments=eof)
"${esbuild[@]}" src/main.ts --format=iife --target=es2020 --outfile="$out/app.js"
"${esbuild[@]}" src/style.css --outfile="$out/app.css"
cp src/index.html "$out/index.html"
# The sources in a fixed order, then the files built from them, as `sha256sum` prints them.
{
    find build.sh package.json package-lock.json tsconfig.json src -type f | LC_ALL=C sort |
        xargs sha256sum
    (cd "$out" && sha256sum app.css app.js index.html) | sed 's|  |  dist/|'
} >"$out/SOURCES.sha256"
if [ "$out" != dist ]; then
    diff -r dist "$out" >/dev/null || {
        echo "web/build.sh --check: dist/ is not what the sources build to; run web/build.sh" >&2
        diff -r dist "$out" | head -20 >&2
        exit 1
    }
    echo "web/build.sh --check: dist/ matches the sources"
fi
