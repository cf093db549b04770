"""Multimodal preprocessing: chat template, tokenizer, safe image decoding, mm_hash, processor
cache, placeholder expansion and M-RoPE positions (preprocessor.py). The preprocess service wraps
this library. The package itself imports nothing, so a torch-free caller (the gateway, which reads
``config.PreprocessConfig``) does not load the image code."""
