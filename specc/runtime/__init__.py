"""Running exported ONNX models on onnxruntime: sessions with a checked provider (``session``), the model and its
metadata (``model``), input parsing and checking (``inputs``), greedy decoding over the KV-cache or RNN step
graph (``generate``) and latency statistics (``bench``). ``specc run`` (specc/cli/onnx_cmds.py) sits on top."""
