"""polyml's version (a leaf module: importing it imports nothing else of polyml)."""

__version__ = "0.1.0"
