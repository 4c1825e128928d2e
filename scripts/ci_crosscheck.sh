#!/usr/bin/env bash
# CI, second stage: hfcheck against vLLM's own code.
#
# Installs the vLLM release hfcheck predicts for by default (with the torch and transformers it
# pins) in its own virtual environment, .venv-vllm, adds hfcheck to it (editable, --no-deps: vLLM's pins stay), then over
# every causal-LM model type (the atlas):
#   1. scripts/crosscheck/vllm_side.py      vLLM's get_fusers / Fusers / attention / MoEBlockFuser
#   2. scripts/crosscheck/hfcheck_side.py   hfcheck's prediction of the same, same cut models
#   3. scripts/crosscheck/atlas_crosscheck.py   `hfcheck scan --cross-check` on each default config
#   4. scripts/crosscheck/gate.py           fail on any disagreement not listed, with its
#                                           reason, in scripts/crosscheck/known_differences.toml
# Model types: those of vLLM's transformers, intersected with .venv's (stage one) when present.
#
# On the 2-core CI machine: vLLM install ~7 min (first time; a .venv-vllm that already holds
# the pinned vLLM is reused), steps 1-4 ~2.5 min.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR TRANSFORMERS_VERBOSITY=error
VENV=${VLLM_VENV:-.venv-vllm}
# the release hfcheck predicts for by default (analyzer/vllm/release.py DEFAULT)
VLLM_VERSION=${VLLM_VERSION:-$(.venv/bin/python -c 'from hfcheck.analyzer.vllm.release import DEFAULT; print(DEFAULT)')}
OUT=$(mktemp -d -t hfcheck-crosscheck.XXXXXX)
start=$SECONDS
stamp() { echo "[ci_crosscheck +$((SECONDS - start))s] $*"; }

if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VLLM_VERSION')" 2>/dev/null; then
  stamp "reusing $VENV (vLLM $VLLM_VERSION)"
else
  stamp "installing vLLM $VLLM_VERSION in $VENV"
  rm -rf "$VENV"
  # pip install vllm==X; a requirement the index lacks (0.34.0's flashinfer-python==0.7.3) is left out, named
  if ! .venv/bin/python scripts/vllm_env.py "$VLLM_VERSION" "$VENV"; then
    # An unreachable registry is not a disagreement with vLLM: say so loudly, do not block.
    stamp "SKIPPED: vLLM $VLLM_VERSION could not be installed (registry unreachable?); no cross-check ran"
    exit 0
  fi
fi
# hfcheck itself, without letting pip touch vLLM's torch/transformers; then the few
# dependencies of hfcheck that vLLM does not already bring (no-ops when present).
"$VENV/bin/pip" install -q -e . --no-deps
"$VENV/bin/pip" install -q "networkx>=3.0" "rich>=13" "platformdirs>=3" "huggingface_hub>=1.0"
PY="$VENV/bin/python"
stamp "$("$PY" -c 'import vllm, torch, transformers; print("vLLM", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"

TYPES_ARG=()
if [ -x .venv/bin/python ]; then
  .venv/bin/python -c 'from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M; print("\n".join(M))' > "$OUT/types_main.txt"
  TYPES_ARG=(--other-types "$OUT/types_main.txt")
fi

stamp "1/4 vLLM side"
CROSSCHECK_OUT="$OUT/vllm.json" "$PY" scripts/crosscheck/vllm_side.py "${TYPES_ARG[@]}" > "$OUT/vllm.log" 2>&1 || { tail -20 "$OUT/vllm.log"; exit 1; }
stamp "2/4 hfcheck side"
CROSSCHECK_OUT="$OUT/hfcheck.json" "$PY" scripts/crosscheck/hfcheck_side.py "${TYPES_ARG[@]}" > "$OUT/hfcheck.log" 2>&1 || { tail -20 "$OUT/hfcheck.log"; exit 1; }
stamp "3/4 hfcheck scan --cross-check over the atlas"
CROSSCHECK_OUT="$OUT/atlas.json" "$PY" scripts/crosscheck/atlas_crosscheck.py "${TYPES_ARG[@]}" > "$OUT/atlas.log" 2>&1 || { tail -20 "$OUT/atlas.log"; exit 1; }
stamp "4/4 gate"
status=0
"$PY" scripts/crosscheck/gate.py "$OUT/vllm.json" "$OUT/hfcheck.json" "$OUT/atlas.json" --known scripts/crosscheck/known_differences.toml || status=$?
stamp "done (outputs in $OUT)"
exit $status
