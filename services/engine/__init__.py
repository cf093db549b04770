"""The compute core: paged KV with multimodal prefix caching, the encoder cache, the Qwen2-VL
decoder over paged attention, and a single-process engine (schedule -> run -> postprocess)."""
