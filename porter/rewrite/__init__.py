"""The in-place rewrite of remote code: ``dataflow`` finds and proves the attention regions and
packed projections on the reference recording, ``codemods`` apply the conventions (LibCST),
``state`` is what they read and change, ``equivalence`` proves the rewritten model computes the
original's logits."""
