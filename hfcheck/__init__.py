"""hfcheck: will vLLM's transformers backend load, fuse and shard this model?"""

__version__ = "0.1.0"
