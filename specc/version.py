"""specc's version, a leaf module: every layer that writes an artifact records it (ONNX producer, checkpoint
metadata, model.py header)."""

__version__ = "0.1.0"
