"""The checkpoint's pooling, read as vLLM reads a sentence-transformers layout (services/models/pooling.py),
and vLLM's checks of a request's ``dimensions``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from services.models.pooling import PoolingConfig, PoolingKind, check_dimensions, read_pooling_config

POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
PLAIN = SimpleNamespace()


def _checkpoint(tmp_path, modules: list | None, pooling: dict | None = None):
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


def test_a_generative_checkpoint_pools_its_last_token_normalized(tmp_path):
    assert read_pooling_config(_checkpoint(tmp_path, None), PLAIN, 64) == PoolingConfig(PoolingKind.LAST, True, 64)


def test_modules_without_a_pooling_module_leave_the_defaults(tmp_path):
    transformer = {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}
    config = read_pooling_config(_checkpoint(tmp_path, [transformer]), PLAIN, 8)
    assert (config.kind, config.normalize) == (PoolingKind.LAST, True)


@pytest.mark.parametrize(
    ("settings", "kind"),
    [
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, PoolingKind.MEAN),
        ({"pooling_mode_cls_token": True}, PoolingKind.CLS),
        ({"pooling_mode_lasttoken": True}, PoolingKind.LAST),
        ({"pooling_mode": "mean"}, PoolingKind.MEAN),
        ({"pooling_mode_max_tokens": True, "pooling_mode_include_prompt": True}, PoolingKind.LAST),  # none vLLM pools by
    ],
)
def test_the_pooling_module_sets_the_kind_and_a_normalize_module_the_normalization(tmp_path, settings, kind):
    config = read_pooling_config(_checkpoint(tmp_path, [POOLING], settings), PLAIN, 8)
    assert (config.kind, config.normalize) == (kind, False)
    (tmp_path / "n").mkdir()
    normalized = read_pooling_config(_checkpoint(tmp_path / "n", [POOLING, NORMALIZE], settings), PLAIN, 8)
    assert (normalized.kind, normalized.normalize) == (kind, True)


def test_dimensions_follow_vllms_checks(tmp_path):
    plain = read_pooling_config(_checkpoint(tmp_path, None), PLAIN, 64)
    check_dimensions(plain, "m", None)
    with pytest.raises(ValueError, match="does not support Matryoshka embeddings; dimensions must be unset"):
        check_dimensions(plain, "m", 8)
    any_size = read_pooling_config(tmp_path, SimpleNamespace(is_matryoshka=True), 64)
    check_dimensions(any_size, "m", 8)
    with pytest.raises(ValueError, match=r"only supports dimensions in range \[1, 64\], got 65"):
        check_dimensions(any_size, "m", 65)
    listed = read_pooling_config(tmp_path, SimpleNamespace(matryoshka_dimensions=[16, 32]), 64)
    check_dimensions(listed, "m", 16)
    with pytest.raises(ValueError, match=r"only supports Matryoshka dimensions \[16, 32\], got 8"):
        check_dimensions(listed, "m", 8)
