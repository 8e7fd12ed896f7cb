"""The `tether` command (see `main`)."""

from .main import main

__all__ = ["main"]
