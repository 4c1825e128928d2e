#!/usr/bin/env bash
# Type-check the product code (the hfcheck namespace, not tests/ or scripts/) with mypy, configured
# in pyproject.toml's [tool.mypy] (which names the one part not yet held to it). The namespace's
# folders sit at the checkout's top level and are mapped by setuptools' package-dir, which mypy
# cannot follow: this links them into one `hfcheck` tree in a temporary folder and checks it there.
#
#   scripts/typecheck.sh            # all of hfcheck (CI runs this)
#   scripts/typecheck.sh -- ARGS    # ARGS go to mypy
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/hfcheck"
for entry in "$ROOT"/hfcheck/*; do
  ln -s "$entry" "$TMP/hfcheck/$(basename "$entry")"
done
# every other top-level folder package-dir maps into the namespace
"$PY" - "$ROOT" "$TMP" <<'PY'
import sys, tomllib
from pathlib import Path
root, tmp = Path(sys.argv[1]), Path(sys.argv[2])
mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
for package, folder in mapping.items():
    if package != "hfcheck":
        (tmp / "hfcheck" / package.removeprefix("hfcheck.")).symlink_to(root / folder)
PY
[ "${1:-}" = "--" ] && shift
cd "$TMP"
"$PY" -m mypy --config-file "$ROOT/pyproject.toml" --python-executable "$PY" \
  --cache-dir "$ROOT/.mypy_cache" -p hfcheck "$@"
