"""tensorgate: a KServe V2 / Triton-compatible inference server."""

__version__ = "0.1.0"
__all__ = ["__version__"]
