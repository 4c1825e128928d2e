"""Real vLLM as the runtime truth: which vLLM runs here (``environment``: the installed one on a
GPU, else the cached CPU build), ``serve`` (``hfcheck serve``: a real OpenAI-compatible server, one
greedy completion compared with transformers' ``generate``), the runtime cross-check's batches
(``batch`` causal LMs, ``vlm``, ``pooling``, run in vLLM's environment), and what vLLM's
transformers backend decided, read from its own log and compared with hfcheck's prediction
(``decisions``)."""
