"""Regenerate analyzer/data/vllm_architectures.json from an installed vLLM.

Run with the Python of an environment where vLLM is installed:
    python scripts/generate_vllm_registry.py analyzer/data/vllm_architectures.json
"""

import json
import sys

import vllm
from vllm.model_executor.models import registry

supported = set(vllm.ModelRegistry.get_supported_archs())
always_transformers = set(registry._TRANSFORMERS_SUPPORTED_MODELS) | set(registry._TRANSFORMERS_BACKEND_MODELS)
table = {
    "vllm_version": vllm.__version__,
    "native": sorted(supported - always_transformers),
    "always_transformers_backend": sorted(registry._TRANSFORMERS_SUPPORTED_MODELS),
}
with open(sys.argv[1], "w") as fh:
    json.dump(table, fh, indent=1)
    fh.write("\n")
