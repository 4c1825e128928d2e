"""The analysis core. Data flows one way through the subpackages:

sources (reference -> config + code) -> facts (config -> ModelFacts) -> instance (tiny
meta model) -> graph (fx/ast observations per module class) -> fusions (vLLM's patterns)
-> rules (findings with stable codes) -> report (verdict, score, plans) -> render.
"""
