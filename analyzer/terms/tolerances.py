"""Every numerical tolerance hfcheck judges equality by, in one table: what is compared, in
what precision, and why the bound is where it is. Relative errors are max |a - b| / max |a|."""

PORT_LOGITS = 1e-4
"""A port's (retarget or rewrite) logits against the original's in its own release, float32,
with the same greedy token at every position: different kernels (eager vs sdpa, fused vs
separate projections) reorder float32 sums, which moves logits by ~1e-6; a real difference of
function (a rotary base 0.1% off, a missing bias) shows at 1e-5 and above."""

ATTENTION_REGION = 1e-4
"""A hand-written attention region against softmax(scale * Q K^T + mask) V on its recorded
values (float64 recomputation of float32 activations)."""

SCALE_MATCH = 1e-5
"""A measured attention scale against an expression of the module's attributes (1/sqrt(d),
a config's softmax scale), relative."""

VERIFY_OUTPUT = 1e-5
"""verify: the fused, sharded or expert-parallel model against the plain one, float32, same
weights and inputs: only float32 reassociation separates them."""

PLAIN_LINEAR = (1e-4, 1e-5)
"""(rtol, atol) for "a Linear subclass's forward computes x @ W.T + b" on random probes."""

SAME_HIDDEN_STATES = (1e-4, 1e-5)
"""(rtol, atol) for "vLLM's call (token ids and positions alone) computes the hidden states
transformers' own call does" (pooling models' position ids), same weights, float32."""
