"""The weight fingerprint: two checkpoints under one name get different model ids (so different
mm_hashes and index namespaces), the same bytes get the same id everywhere, and Hub blobs are
identified by their content-addressed names without being read."""

from __future__ import annotations

import shutil

from services.models.fingerprint import file_digest, fingerprint
from services.models.registry import resolve_model


def test_one_name_two_weights_two_ids_and_the_same_bytes_one_id(tiny_model, tmp_path):
    v1, v2, again = tmp_path / "v1" / "vlm", tmp_path / "v2" / "vlm", tmp_path / "again" / "vlm"
    for directory in (v1, v2, again):
        shutil.copytree(tiny_model.path, directory)
    weights = bytearray((v2 / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # one bit of one weight
    (v2 / "model.safetensors").write_bytes(bytes(weights))
    first, second, third = (resolve_model(str(d), progress=lambda _m: None) for d in (v1, v2, again))
    assert first.name == second.name == "vlm"
    assert first.model_id != second.model_id and first.model_id == third.model_id
    assert first.model_id == f"vlm@{fingerprint(v1)}"


def test_a_changed_tokenizer_or_config_changes_the_fingerprint(tiny_model, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(tiny_model.path, copy)
    before = fingerprint(copy)
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"extra_field": 1, ', 1))
    assert fingerprint(copy) != before


def test_hub_cache_blobs_are_named_by_their_content(tmp_path):
    blob = tmp_path / "blobs" / ("ab" * 32)
    blob.parent.mkdir()
    blob.write_bytes(b"weights")
    snapshot = tmp_path / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blob)
    assert file_digest(snapshot / "model.safetensors") == "hub:" + "ab" * 32
    plain = tmp_path / "plain.safetensors"
    plain.write_bytes(b"weights")
    assert file_digest(plain).startswith("blake3:")
