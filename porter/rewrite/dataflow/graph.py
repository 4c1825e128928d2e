"""The recorded layer as a networkx graph of ops and tensor versions, and its attention cores
(an SDPA op, or softmax between the QK^T and PV products).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import networkx as nx

MATMUL = {"matmul", "__matmul__", "bmm", "baddbmm", "einsum", "__rmatmul__"}


SOFTMAX = {"softmax", "_softmax", "log_softmax"}


LAYOUT = {"view", "reshape", "permute", "transpose", "contiguous", "to", "float", "half", "bfloat16", "double", "type", "type_as",
          "expand", "expand_as", "repeat", "repeat_interleave", "__getitem__", "clone", "unsqueeze", "squeeze", "flatten", "unflatten",
          "split", "chunk", "unbind", "narrow", "detach", "mT", "T", "t", "movedim", "swapaxes", "select", "as_strided", "cat"}


@dataclass
class Core:
    op: int  # index of the sdpa / P V op
    kind: str  # "sdpa" | "softmax"
    q: int
    k: int
    v: int
    out: int
    scores: int | None = None  # softmax input (the masked, scaled scores)
    softmax_op: int | None = None
    qk_op: int | None = None
    scale: float | None = None  # sdpa's scale= (None: its default)


class Dataflow:
    """The recorded layer as a graph: op nodes ("o<i>") and value nodes (int)."""

    def __init__(self, df: dict[str, Any], tensors: dict[str, Any], result: dict[str, Any]):
        self.df = df
        self.ops: list[dict] = df["ops"]
        self.frames: list[dict] = df["frames"]
        self.tensors = tensors
        self.files: dict[str, str] = {}
        self.tokens: tuple[int, int] = (0, 0)  # (batch, seq) of the recorded run
        self.config: dict[str, Any] = {}  # the config of the recorded run
        self.g = nx.DiGraph()
        self.producer: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for n in op["in"]:
                self.g.add_edge(n, ("op", i))
            for n in op["out"]:
                if n not in op["in"]:  # an op returning its input (x.float() on float) adds no value
                    self.g.add_edge(("op", i), n)
                    self.producer[n] = i
        self.modules_by_name = {m["name"]: m for m in result.get("modules", [])}

    def value(self, node: int):
        return self.tensors.get(f"df.{node}")

    def shape(self, node: int) -> list[int]:
        return self.df["nodes"][node]["shape"]

    def ancestors(self, node: int) -> set:
        return nx.ancestors(self.g, node) if node in self.g else set()

    def descendants(self, node: int) -> set:
        return nx.descendants(self.g, node) if node in self.g else set()

    def at(self, op: int) -> list[list[int]]:
        return self.ops[op]["at"]

    def where(self, op: int) -> tuple[str, int]:
        stack = self.at(op)
        if not stack:
            return "?", 0
        uid, line = stack[0]
        return self.frames[uid]["file"], line

    # ------------------------------------------------------------------ cores

    def cores(self) -> list[Core]:
        found = []
        for i, op in enumerate(self.ops):
            name = op["op"]
            if name == "scaled_dot_product_attention" and len(op["in"]) >= 3:
                scale = op["kwargs"].get("scale")
                found.append(Core(i, "sdpa", op["in"][0], op["in"][1], op["in"][2], op["out"][0],
                                  scale=scale if isinstance(scale, (int, float)) else None))
            elif name in SOFTMAX and op["in"]:
                core = self._hand_core(i)
                if core is not None:
                    found.append(core)
        return found

    def _hand_core(self, i: int) -> Core | None:
        scores, probs = self.ops[i]["in"][0], self.ops[i]["out"][0]
        qk = self._nearest_producer(scores, MATMUL)
        if qk is None:
            return None
        q_in, kt_in = self.ops[qk]["in"][-2:]
        after = self.descendants(probs)
        for j in range(i + 1, len(self.ops)):
            op = self.ops[j]
            if op["op"] in MATMUL and len(op["in"]) >= 2 and op["in"][-2] in (after | {probs}):
                return Core(j, "softmax", q_in, self._untransposed(kt_in), op["in"][-1], op["out"][0], scores=scores, softmax_op=i, qk_op=qk)
        return None

    def _untransposed(self, node: int) -> int:
        """K for the K^T operand (the transpose op's input), else the operand itself."""
        p = self.producer.get(node)
        if p is not None and self.ops[p]["op"] in ("transpose", "mT", "permute", "t", "T") and self.ops[p]["in"]:
            return self.ops[p]["in"][0]
        return node

    def _nearest_producer(self, node: int, names: set[str]) -> int | None:
        seen = {node}
        frontier = [node]
        while frontier:
            nxt = []
            for n in frontier:
                p = self.producer.get(n)
                if p is None:
                    continue
                if self.ops[p]["op"] in names:
                    return p
                for m in self.ops[p]["in"]:
                    if m not in seen:
                        seen.add(m)
                        nxt.append(m)
            frontier = nxt
        return None

    def output_projection(self, core: Core) -> dict | None:
        after = self.descendants(core.out) | {core.out}
        for m in self.df["modules"]:
            if m["linear"] and m["start"] > core.op and m["in"] and m["in"][0] in after:
                return m
        return None


def first_input_path(g: Dataflow, src: int, dst: int) -> list[int] | None:
    """Value nodes from ``src`` to ``dst`` along first inputs (the data path of a layout chain)."""
    chain = [dst]
    cur = dst
    for _ in range(400):
        if cur == src:
            return list(reversed(chain))
        p = g.producer.get(cur)
        if p is None or not g.ops[p]["in"]:
            return None
        cur = g.ops[p]["in"][0]
        chain.append(cur)
    return None
