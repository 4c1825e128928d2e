"""Find each attention core in the original's recorded dataflow, and prove what it computes.

The reference run records decoder layer 0 as it ran in the original's own release
(``porter/reference/record.py``): every torch op on tensor versions, every module call, and at
each source line the tensor locals of the remote frame. From that graph (networkx) this module
finds, for the attention module:

- the core: a ``scaled_dot_product_attention`` op, or ``softmax`` with the ``Q K^T`` product
  before it and the ``P V`` product after it, wherever it ran (in ``forward``, in a helper
  such as ``_attn``, in the branch of an ``if`` the run took);
- the output projection: the first ``nn.Linear`` call fed by the core's output; the frame
  that calls it is the attention ``forward``, and its argument's variable is the region's end;
- the region: the statements of the block holding that call, from the one that runs the core
  (widened backwards over statements that only reshape the core's inputs) up to the
  projection; q, k and v are the variables the region reads, as they were when it started
  (post-RoPE, before any head repeat).

Then it *proves* the region is ``softmax(scale * Q K^T + causal mask) V`` on the recorded
values (float64; the scale measured from the recorded scores, GQA from the recorded shapes):
only then may the codemod replace the region with one attention-interface call. A region that
computes something else is refused with the op that makes it differ (file:line), never
guessed. Nothing here runs model code: it reads what the reference run recorded.
"""

from __future__ import annotations

from typing import Any

from hfcheck.porter.rewrite.dataflow.graph import Dataflow
from hfcheck.porter.rewrite.dataflow.plan import CorePlan, CoreRefusal, Refuse, SplitPlan
from hfcheck.porter.rewrite.dataflow.region import plan_core

__all__ = ["CorePlan", "CoreRefusal", "SplitPlan", "plans"]


def plans(result: dict[str, Any], tensors: dict[str, Any], files: dict[str, str], input_ids: list[list[int]],
          config: dict[str, Any] | None = None) -> list[CorePlan | CoreRefusal]:
    """One plan (or refusal) per attention class whose core ran in the recorded layer
    (``input_ids``: the token ids of the recorded run, for its batch and sequence sizes;
    ``config``: its config, whose keys a weight rule may name)."""
    df = result.get("dataflow")
    if not df or not df.get("ops") or df.get("failed") or df.get("truncated"):
        return []  # nothing (complete) was recorded: the statement patterns decide
    graph = Dataflow(df, tensors, result)
    graph.files = files
    graph.tokens = (len(input_ids), len(input_ids[0]) if input_ids else 0)
    graph.config = dict(config or {})
    out: list[CorePlan | CoreRefusal] = []
    seen: set[str] = set()
    for core in graph.cores():
        try:
            plan = plan_core(graph, core, files, result)
        except Refuse as exc:
            plan = CoreRefusal(exc.cls, exc.file, exc.line, exc.code, exc.reason)
        if plan is None or plan.cls in seen:
            continue
        seen.add(plan.cls)
        out.append(plan)
    return out
