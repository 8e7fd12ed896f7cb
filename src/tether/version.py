"""Tether's version, a value of its own so that any module can name it without importing the
package root (which imports the runtime)."""

__version__ = "0.1.0"
