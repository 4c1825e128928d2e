"""The floor every other room stands on: command conventions (exit codes, the one-line-error
parser), hfcheck's store of cached environments (a transformers release, CUDA-only packages),
the packages vLLM's environments lack, and the version. Nothing here imports another room."""
