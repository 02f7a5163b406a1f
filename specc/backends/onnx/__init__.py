"""ONNX backend: the IR emitted as an ONNX graph with exactly one fused attention node per attention layer.

Entry point: ``export.export_onnx`` (also ``specc.export_onnx`` and ``specc compile --target onnx``).

Layout of the package (one job per file):
- ``builder``          graph builder over onnx.helper, export options, symbolic axis names
- ``op_registry``      op kind → ``make_<op>`` table (``@emits``), a leaf the ``ops_*`` modules fill
- ``emit``             the walk over IR ops; imports every ``ops_*`` module
- ``ops_embed``        embeddings, positions (learned / sinusoidal / 2-D), patches, class token
- ``ops_dense``        norms, linear, activations, GLU, residual add, pooling
- ``ops_attention``    the fused attention node (ai.onnx ``Attention`` or com.microsoft MHA / GQA), RoPE
- ``contrib``          which com.microsoft op (GQA or MHA) serves a layer, and what they cannot express
- ``positions``        position ids per stack: past + arange, or following attention_mask (HF), or fed
- ``masks``            padding / sliding-window / prefix masks, built once per stack
- ``ops_moe``          mixture of experts
- ``ops_rnn``          recurrent encoder (ONNX GRU / LSTM / RNN nodes), the RNN decoder step
- ``kv_cache``         ``past_key_values.{i}.key|value`` → ``present.{i}.key|value``
- ``graph_transformer`` / ``graph_rnn``   whole graphs (RNN seq2seq: encoder + one decoder step)
- ``tables``           position encodings computed as the torch backend computes them
- ``recipes``          how each weight initializer is made from parameters (cast, concat, MatMulNBits), in chunks
- ``sources``          where parameters come from: safetensors / HF checkpoints by rows, the seeded init, a dict
- ``stream``           the weights streamed from their source through the recipes into the files; checker
- ``save``             metadata, the 2 GB line past which tensors go to external data
- ``genai``            ``genai_config.json`` for onnxruntime-genai (``--genai``)

I/O names: inputs ``input_ids``, ``attention_mask`` (1 = token), ``token_type_ids``, ``pixel_values``,
``decoder_input_ids``, ``past_key_values.{i}.key|value``, and for decoder-only models an optional
``position_ids`` [batch, sequence] (an overridable initializer; by default positions follow attention_mask as
HF's generate counts them, so left-padded batches work: see positions.py); outputs ``logits``
(``last_hidden_state``, ``pooler_output`` for encoders), ``present.{i}.key|value``. Axes ``batch``, ``sequence``,
``decoder_sequence``, ``past_sequence``, ``total_sequence`` are dynamic.
"""
