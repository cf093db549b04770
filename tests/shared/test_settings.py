"""Configuration from flags and environment: precedence, parsing, and validation errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.preprocess.config import PreprocessConfig


def _args(parser_setup, argv):
    parser = argparse.ArgumentParser()
    parser_setup(parser)
    return parser.parse_args(argv)


def test_flags_beat_environment_beat_defaults(tmp_path):
    env = {"TESSERA_PREPROCESS_MAX_IMAGES_PER_REQUEST": "3", "TESSERA_PREPROCESS_MAX_IMAGE_BYTES": "1000"}
    args = _args(PreprocessConfig.add_cli_arguments, ["--max-image-bytes", "2000", "--local-media-dir", str(tmp_path)])
    config = PreprocessConfig.from_sources(args, env)
    assert config.max_image_bytes == 2000 and config.max_images_per_request == 3
    assert config.local_media_dir == Path(tmp_path).resolve()
    assert config.max_prompt_tokens == PreprocessConfig().max_prompt_tokens


def test_bools_tuples_and_strings_parse():
    args = _args(PreprocessConfig.add_cli_arguments, ["--allow-remote-images", "--allowed-image-domains", "A.com, b.org"])
    config = PreprocessConfig.from_sources(args, {})
    assert config.allow_remote_images and config.allowed_image_domains == ("a.com", "b.org")
    engine = EngineConfig.from_sources(
        None, {"TESSERA_ENGINE_DISABLE_CHUNKED_MM_INPUT": "yes", "TESSERA_ENGINE_ATTENTION_BACKEND": "torch"}
    )
    assert engine.disable_chunked_mm_input and engine.attention_backend == "torch"


@pytest.mark.parametrize(
    "env,message",
    [
        ({"TESSERA_ENGINE_BLOCK_SIZE": "big"}, "invalid value for block_size"),
        ({"TESSERA_ENGINE_BLOCK_SIZE": "0"}, "block_size must be positive"),
        ({"TESSERA_ENGINE_ENABLE_PREFIX_CACHING": "maybe"}, "invalid value for enable_prefix_caching"),
        ({"TESSERA_ENGINE_ATTENTION_BACKEND": "cuda"}, "attention_backend"),
        ({"TESSERA_ENGINE_MAX_ENCODER_TOKENS_PER_STEP": "99999"}, "cannot exceed encoder_cache_tokens"),
    ],
)
def test_invalid_engine_settings_are_clear_errors(env, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_sources(None, env)


def test_preprocess_validation():
    with pytest.raises(ValueError, match="allow_remote_images is off"):
        PreprocessConfig(allow_remote_images=False, allowed_image_domains=("a.com",))
    with pytest.raises(ValueError, match="min_pixels must not exceed"):
        PreprocessConfig(min_pixels=10, max_pixels=5)
    with pytest.raises(ValueError, match="must be positive"):
        PreprocessConfig(max_images_per_request=0)


def test_role_settings_come_from_flags_then_tessera_serve_variables(monkeypatch):
    from services.stack.roles import role_settings

    monkeypatch.setenv("TESSERA_SERVE_MAX_BATCH_ROWS", "512")
    monkeypatch.setenv("TESSERA_SERVE_LOCAL_ENCODE", "off")
    encoder = role_settings("encoder", argparse.Namespace(max_pending_requests="7"))
    assert encoder.max_batch_rows == 512 and encoder.max_pending_requests == 7
    assert not role_settings("prefill", argparse.Namespace()).local_encode
    assert role_settings("prefill", argparse.Namespace(local_encode="yes")).local_encode  # a flag beats the variable
    monkeypatch.setenv("TESSERA_SERVE_MAX_BATCH_ROWS", "many")
    with pytest.raises(ValueError, match="invalid value for max_batch_rows: 'many'"):
        role_settings("encoder", argparse.Namespace())
