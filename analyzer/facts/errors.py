"""The one error the facts stage raises: a config that cannot describe a model."""


class FactsError(Exception):
    """The config cannot describe a model (one line for the user)."""
