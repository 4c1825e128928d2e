"""What the dataflow analysis hands the codemods: a proven region (CorePlan, with its packed
projection's SplitPlan) or a refusal at file:line (CoreRefusal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CorePlan:
    """A proven attention region of one class's ``forward``, in source terms."""

    cls: str
    file: str
    start_line: int  # first line of the region's first statement
    end_line: int  # last line of its last statement
    block_line: int  # a line of the statement that calls the output projection (same block)
    q: str
    k: str
    v: str  # expressions giving [batch, heads, seq, head_dim]
    out: str
    out_layout: str  # "bsD" | "bshd" | "bhsd": what the statements after the region expect
    weights: str | None
    mask: str
    scaling: str | None  # source of the scale ("self.x", "1.0", an expression for __init__) or None (1/sqrt(head_dim))
    scaling_init: str | None  # expression to store as self.<attr> in __init__, when scaling needs one
    dropout: str | None
    what: str
    max_rel_error: float
    notes: list[str] = field(default_factory=list)
    split: SplitPlan | CoreRefusal | None = None  # the packed q/k/v projection feeding it, if any
    groups: str | None = None  # __init__ expression for num_key_value_groups (sdpa repeats k/v by it) when heads are grouped
    softcap: float | None = None  # the logit softcap c of c * tanh(scores / c) (vLLM: config.attn_logit_softcapping)
    head_attr: str | None = None  # ``self.<attr>`` holding the head size, when the module has one
    function: str = "forward"  # the method holding the region (a helper of forward, e.g. _forward_self_attn)
    returns: bool = False  # the region ends that helper: it will return q, k and v instead
    caller_line: int = 0  # the statement of forward that calls the helper (the interface call goes there: vLLM reads forward)
    caller_call: str = ""  # that call's source


@dataclass
class SplitPlan:
    """A packed q/k/v projection, its row order found by matching the recorded values column by
    column (whatever the idiom that cut it): the statements that cut it become one
    ``.split((self.q_size, self.kv_size, self.kv_size), dim=-1)`` and views, the form vLLM shards
    and fuses. Rows already [q | k | v] keep the weights; rows per head ([h, 3, d]) or per
    key/value group ([kv, g + 2, d]) are reordered to [q | k | v] by a weight rule."""

    packed: str  # the attribute of the packed nn.Linear
    packed_var: str  # what the split reads: the projection call itself, or the variable holding its output
    start_line: int
    end_line: int
    names: tuple[str, str, str]  # the variables q, k and v are bound to at the end of the cut
    views: tuple[str, str, str]  # each one's layout: "bsD" | "bshd" | "bhsd"
    q_size: str
    kv_size: str  # __init__ expressions
    head_attr: str | None
    regroup: dict[str, Any] | None = None  # rows not [q | k | v]: the weight rule that reorders them (porter.output.weights)


@dataclass
class CoreRefusal:
    cls: str
    file: str
    line: int
    code: str
    reason: str


class Refuse(Exception):
    def __init__(self, cls: str, file: str, line: int, code: str, reason: str):
        super().__init__(reason)
        self.cls, self.file, self.line, self.code, self.reason = cls, file, line, code, reason


def refuser(cls: str, file: str):
    def make(line: int, reason: str, code: str = "HFC803") -> Refuse:
        return Refuse(cls, file, line, code, reason)

    return make
