"""Qwen2-VL / Qwen2.5-VL: our text decoder over paged KV, and transformers' vision tower."""
