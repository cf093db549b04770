"""A checkpoint's tokenizer, as transformers' ``AutoTokenizer`` loads it.

Loading one costs seconds for a 150k-token vocabulary (transformers parses tokenizer.json in
Python and rebuilds the BPE from it), and every node of a local stack loads the same one. So the
stack's zygote (services/stack/zygote.py) loads it once before it forks the nodes; each forked
process takes that copy the first time it asks, and any later caller in the process loads its
own, so no two owners ever share one tokenizer object.
"""

from __future__ import annotations

from pathlib import Path

_preloaded: dict[Path, object] = {}


def preload_tokenizer(model_dir: Path) -> None:
    """Load ``model_dir``'s tokenizer now, for the first ``load_tokenizer`` of it to take."""
    _preloaded[model_dir.resolve()] = _load(model_dir)


def load_tokenizer(model_dir: Path):
    """``AutoTokenizer.from_pretrained(model_dir)``: the preloaded copy if one is waiting."""
    preloaded = _preloaded.pop(model_dir.resolve(), None)
    return preloaded if preloaded is not None else _load(model_dir)


def _load(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
