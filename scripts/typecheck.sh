#!/usr/bin/env bash
# Type-check the product code (the hfcheck namespace, not tests/ or scripts/) with mypy, configured
# in pyproject.toml's [tool.mypy]. The namespace's folders sit at the checkout's top level and are
# mapped by setuptools' package-dir, which mypy cannot follow: this builds the namespace as a tree
# of symlinks in a temporary folder and checks it there.
#
#   scripts/typecheck.sh                      # all of hfcheck
#   scripts/typecheck.sh core analyzer ...    # only these parts (CI: see .ci/run)
#
# Parts: `core` (hfcheck/: the CLI, shared/, isolation/) and the subpackages analyzer, porter,
# runtime, tui, verify, sweep. With parts named, the others are still read for their types where
# the named ones import them, but their own errors are reported only when they are named (or when
# no part is). Anything after `--` goes to mypy.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
SUBPACKAGES=(analyzer porter runtime tui verify sweep)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/hfcheck"
for entry in "$ROOT"/hfcheck/*; do
  ln -s "$entry" "$TMP/hfcheck/$(basename "$entry")"
done
for sub in "${SUBPACKAGES[@]}"; do
  ln -s "$ROOT/$sub" "$TMP/hfcheck/$sub"
done

core_modules=(hfcheck)
for module in "$ROOT"/hfcheck/*.py; do
  name=$(basename "$module" .py)
  [ "$name" = __init__ ] || core_modules+=("hfcheck.$name")
done
targets=()
named=" "
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    core)
      for m in "${core_modules[@]}"; do targets+=(-m "$m"); done
      targets+=(-p hfcheck.shared -p hfcheck.isolation) ;;
    analyzer|porter|runtime|tui|verify|sweep) targets+=(-p "hfcheck.$1") ;;
    *) echo "typecheck.sh: unknown part $1 (core, ${SUBPACKAGES[*]})" >&2; exit 2 ;;
  esac
  named+="$1 "; shift
done
[ $# -gt 0 ] && shift

CONFIG="$ROOT/pyproject.toml"
if [ ${#targets[@]} -eq 0 ]; then
  targets=(-p hfcheck)
else
  # the parts not named: followed for their types, their errors not reported
  quiet=()
  if [[ "$named" != *" core "* ]]; then
    quiet+=("${core_modules[@]}" hfcheck.shared "hfcheck.shared.*" hfcheck.isolation "hfcheck.isolation.*")
  fi
  for sub in "${SUBPACKAGES[@]}"; do
    [[ "$named" == *" $sub "* ]] || quiet+=("hfcheck.$sub" "hfcheck.$sub.*")
  done
  if [ ${#quiet[@]} -gt 0 ]; then
    CONFIG="$TMP/pyproject.toml"
    cp "$ROOT/pyproject.toml" "$CONFIG"
    {
      echo
      echo "[[tool.mypy.overrides]]"
      printf 'module = ['; printf '"%s", ' "${quiet[@]}"; echo ']'
      echo 'follow_imports = "silent"'
    } >> "$CONFIG"
  fi
fi
cd "$TMP"
"$PY" -m mypy --config-file "$CONFIG" --python-executable "$PY" \
  --cache-dir "$ROOT/.mypy_cache" "${targets[@]}" "$@"
