"""Retarget a remote-code model to a native transformers class that computes the same function:
``anatomy`` reads what the original is made of from its reference run, ``targets`` lists the
native classes and their readings of it, ``search`` proves them against the reference logits,
``plan`` converts the weights."""
