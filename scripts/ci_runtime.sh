#!/usr/bin/env bash
# CI's runtime stage: real vLLM (its CPU build, set up once and cached) on a handful of
# families -- dense GQA, MoE, MLA, one blocked hybrid, a vision-language model with an image, two pooling encoders -- compared with hfcheck's prediction,
# then one real remote-code model ported (retargeted, and rewritten in place) and served end to
# end with tokens equal to transformers'. Fails on any difference not listed in scripts/crosscheck/runtime_known_differences.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

.venv/bin/python scripts/runtime_crosscheck.py --types llama,qwen3_moe,deepseek_v3,qwen3_next \
  --out "$WORK/runtime.jsonl" --gate scripts/crosscheck/runtime_known_differences.toml

# a vision-language model (Gemma 3's shape, processor made locally) served with an image and with
# text only, and the same tower with SigLIP's pooling head, which vLLM refuses (HFC907)
.venv/bin/python scripts/runtime_crosscheck.py --vlm --types gemma3,gemma3+vision_use_head \
  --out "$WORK/runtime-vlm.jsonl" --gate scripts/crosscheck/runtime_known_differences.toml

# pooling: BERT served as an embedding model (embedding equal to transformers'), ELECTRA, whose
# embeddings_project vLLM's legacy mapper drops (HFC910: it loads, with a wrong embedding), and
# CamemBERT, whose positions vLLM counts from 0 (HFC912: it loads, with a wrong embedding)
.venv/bin/python scripts/runtime_crosscheck.py --pooling --types pooling:bert,pooling:electra,pooling:camembert \
  --out "$WORK/runtime-pooling.jsonl" --gate scripts/crosscheck/runtime_known_differences.toml

REMOTE=../shared/fixtures/remote-real/internlm-20b
if [ -d "$REMOTE" ]; then
  .venv/bin/python - "$REMOTE" "$WORK" <<'PY'
import json, subprocess, sys
from pathlib import Path
from hfcheck.porter.reference.sample import write_sample
src, work = Path(sys.argv[1]), Path(sys.argv[2])
sample = write_sample(src, work / "sample")
ok = True
# retarget to a native class, and the in-place rewrite of the remote code, each served end to end
# (`port --serve`): the rewrite at TP 1 and 2 (the rewritten code's own tensor-parallel plan), the
# retarget's native class at TP 1 only, which spares CI a vLLM start.
for path, tp2 in (("auto", "no"), ("rewrite", "auto")):
    proc = subprocess.run([sys.executable, "-m", "hfcheck", "port", str(sample), "--out", str(work / f"ported-{path}"), "--path", path,
                           "--serve", "--tp2", tp2, "--format", "json"], capture_output=True, text=True)
    result = json.loads(proc.stdout)
    serve = result.get("serve") or {}
    print(f"port --path {path}: {result['status']} ({result['path']}, {result['message'][:160]})")
    print(f"serve: backend {serve.get('backend')} vLLM {serve.get('vllm_version')}, tokens {serve.get('server_token_ids')} vs {serve.get('reference_token_ids')}, "
          f"differences {serve.get('differences')}, TP 2 {serve['tp2'].get('ok') if serve.get('tp2') else 'not run'}, stopped {serve.get('server_stopped')}")
    ok = ok and proc.returncode == 0 and result["status"] == "ported" and serve.get("ok") and serve.get("backend") in ("vllm", "vllm-cpu") \
        and not serve.get("differences")
sys.exit(0 if ok else 1)
PY
fi
echo "runtime stage OK"
