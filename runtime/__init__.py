"""Real vLLM as the runtime truth: which vLLM runs here (``environment``: the installed one on a
GPU, else the cached CPU build), and what its transformers backend decided, read from its own
log and compared with hfcheck's prediction (``decisions``)."""
