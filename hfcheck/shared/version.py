"""hfcheck's version, kept where every room may read it (the report, the sweep cache's key,
PORT.md); the package root re-exports it."""

__version__ = "0.1.0"
