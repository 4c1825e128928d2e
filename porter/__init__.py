"""Rewrites a model into one vLLM's transformers backend serves at native speed (issue 6)."""
