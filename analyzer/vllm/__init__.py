"""Everything hfcheck knows of vLLM, in one room, per release.

- ``release``: which vLLM release a prediction is for (``--vllm``, the installed one, the default);
- ``registry``: vLLM's model registry (native classes), from the release's generated table or
  the installed vLLM when it is that release;
- ``native_fit``: whether vLLM's native class of an architecture name computes this config;
- ``environment``: what ``pip install vllm==X`` puts beside the model (remote code's imports,
  vLLM's transformers pin);
- ``crosscheck``: the one module that imports and calls vLLM's own code.

The tables these read are generated from vLLM's wheels into ``analyzer/data/``
(``scripts/generate_vllm_*.py``); nothing else in hfcheck reads vLLM's files or imports vLLM.
"""
