"""The original's behaviour where it was written: a cached environment with the transformers
release the remote code declares (``hfcheck.shared.environments``), a fenced child that builds and runs
the original there (``child``, started by ``run``), at a shrunk config (``hfcheck.analyzer.instance.shrink``)."""
