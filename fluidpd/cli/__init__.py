"""Command-line interface (``fluidpd``)."""
