"""The live web page (`tether serve`) and its JSON API."""

from .server import WebApp

__all__ = ["WebApp"]
