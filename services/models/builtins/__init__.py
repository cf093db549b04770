"""The built-in checkpoints (tiny, small and their Qwen3-VL and Gemma3 kin): for each family a spec,
deterministic weights and a tokenizer built offline, written as a Hub-layout directory that
transformers loads (build.py chains them). Nothing here serves a request; the families read a
built-in as they read any checkpoint."""
