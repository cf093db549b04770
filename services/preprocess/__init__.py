"""Multimodal preprocessing: chat template, tokenizer, safe image decoding, mm_hash, processor
cache, placeholder expansion and M-RoPE positions. The preprocess service wraps this library."""

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import PreprocessError
from services.preprocess.preprocessor import MmItem, PreprocessedRequest, Preprocessor

__all__ = ["MmItem", "PreprocessConfig", "PreprocessError", "PreprocessedRequest", "Preprocessor"]
