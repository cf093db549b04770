"""The compute kernels the model code calls, each module one concept:

- attention: ``attention.AttentionBackend``, the one interface; ``torch_backend`` (the reference,
  CPU and GPU: paged KV, sliding windows, bidirectional image spans) and ``flashinfer_backend``
  (CUDA only); ``selector`` is the one place that picks between them.
- CPU products: ``cpu_linear`` (linear layers prepacked once for oneDNN), ``lm_head`` (the
  vocabulary matrix in chunks: logits, or the argmax alone) and ``screened_argmax`` (greedy
  tokens from a bfloat16 copy of the head, checked in float32; with a structured-output mask
  too).
"""
