#!/usr/bin/env bash
# Run both sides and compare. Also runs hfcheck under the vLLM venv's transformers (5.20.2)
# through a throwaway import shim in /tmp, which separates hfcheck bugs (still disagree on the
# same transformers) from transformers 5.20 -> 5.24 modeling differences (agree on 5.20).
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VLLM_VENV:-.venv-vllm}/bin/python   # the venv scripts/ci_crosscheck.sh builds (VLLM_VENV: another)
HPY=.venv/bin/python
$VPY -c 'from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M; print("\n".join(M))' > /tmp/crosscheck_types_vllm.txt 2>/dev/null
$HPY -c 'from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as M; print("\n".join(M))' > /tmp/crosscheck_types_hfcheck.txt
# vLLM's side asks vLLM through hfcheck.analyzer.analysis.crosscheck: the shim makes it importable there too
SHIM=/tmp/crosscheck_shim; rm -rf $SHIM; mkdir -p $SHIM/hfcheck
for f in hfcheck/*; do ln -sfn "$PWD/$f" "$SHIM/$f"; done   # the namespace root (packages.py, isolation/, ...)
ln -sfn "$PWD/analyzer" $SHIM/hfcheck/analyzer
PYTHONPATH=$SHIM $VPY scripts/crosscheck/vllm_side.py --other-types /tmp/crosscheck_types_hfcheck.txt > /tmp/crosscheck_vllm.log 2>&1
$HPY scripts/crosscheck/hfcheck_side.py --other-types /tmp/crosscheck_types_vllm.txt > /tmp/crosscheck_hfcheck.log 2>&1
PYTHONPATH=$SHIM CROSSCHECK_OUT=/tmp/crosscheck_hfcheck_t520.json \
  $VPY scripts/crosscheck/hfcheck_side.py --other-types /tmp/crosscheck_types_hfcheck.txt > /tmp/crosscheck_hfcheck_t520.log 2>&1
echo "################ vLLM (tf 5.20.2) vs hfcheck (tf 5.24) ################"
python3 scripts/crosscheck/compare.py /tmp/crosscheck_vllm.json /tmp/crosscheck_hfcheck.json
echo; echo "################ vLLM vs hfcheck, both on tf 5.20.2 (remaining = hfcheck bugs) ################"
python3 scripts/crosscheck/compare.py /tmp/crosscheck_vllm.json /tmp/crosscheck_hfcheck_t520.json
