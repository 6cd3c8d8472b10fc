"""The `ablate` command (one module per subcommand) and `ablate-lm-eval`."""

from ablate.cli.parser import main

__all__ = ["main"]
