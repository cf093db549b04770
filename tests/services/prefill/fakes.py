"""job.Upstream without gRPC, for running PrefillNode.run directly: the encoder pushes seeded
embeddings to the node's inbox as an encoder node would (or reports it lacks their pixels), and each peer is a real node exporting
its pages (or one that announces pages and never sends them)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from services.engine.engine_node import EngineNode
from services.engine.remote_request import PromptItem
from services.engine.sampling_params import SamplingParams
from services.prefill.job import KVSource, PrefillJob
from services.transport.tensor_channel import TensorSender
from shared.types import BlockHash, LoraRef, MmHash


def prompt_items(prep) -> list[PromptItem]:
    """A preprocessing result's images as the prefill node takes them."""
    return [PromptItem(i.mm_hash, i.placeholder, i.image.grid_thw, i.placement) for i in prep.mm_items]


def prefill_job(
    request_id: str,
    prep,
    decode_address: str,
    *,
    max_tokens: int = 4,
    encoder_address: str | None = "encoder",
    kv_sources: Sequence[KVSource] = (),
    image_to_source: dict[MmHash, str] | None = None,
) -> PrefillJob:
    """A prefill of a preprocessed prompt, its KV shipped to ``decode_address``."""
    return PrefillJob(
        request_id=request_id,
        prompt_token_ids=list(prep.prompt_token_ids),
        items=prompt_items(prep),
        sampling=SamplingParams(max_tokens=max_tokens),
        decode_address=decode_address,
        encoder_address=encoder_address,
        image_to_source=image_to_source or {},
        kv_sources=list(kv_sources),
    )


def seeded_embeddings(item: PromptItem, hidden_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(int(item.mm_hash[:8], 16))
    return torch.randn(item.placeholder.length, hidden_size, generator=generator)


@dataclass
class FakeUpstream:
    hidden_size: int = 0  # of the embeddings the encoder pushes
    peers: dict[str, EngineNode] = field(default_factory=dict)
    silent_peers: frozenset[str] = frozenset()  # announce every block asked for, send none
    lacks_pixels: frozenset[MmHash] = frozenset()  # images the encoder reports it has no pixels for
    num_export_calls: int = 0
    encode_calls: list[tuple[str, list[MmHash]]] = field(default_factory=list)  # (encoder, images asked of it)
    targets: list[str] = field(default_factory=list)  # every target address the node named, in call order
    source_to_lacking: dict[str, frozenset[MmHash]] = field(default_factory=dict)  # holders that no longer hold these
    failing_sources: frozenset[str] = frozenset()  # holders whose call fails outright
    _sender: TensorSender | None = None

    async def encode(
        self, encoder: str, items: Sequence[PromptItem], target: str, deadline_s: float | None = None, lora: LoraRef | None = None
    ) -> list[MmHash]:
        self.encode_calls.append((encoder, [i.mm_hash for i in items]))
        self.targets.append(target)
        if encoder in self.failing_sources:
            raise ConnectionError(f"{encoder} is gone")
        lacking = self.lacks_pixels | self.source_to_lacking.get(encoder, frozenset())
        if self._sender is None:
            self._sender = TensorSender()
        for item in items:
            if item.mm_hash not in lacking:
                await asyncio.to_thread(self._sender.send, target, item.mm_hash, {"embeds": seeded_embeddings(item, self.hidden_size)})
        return [i.mm_hash for i in items if i.mm_hash in lacking]

    async def export_kv(self, peer: str, hashes: Sequence[BlockHash], target: str, transfer_id: str, timeout_s: float) -> int | None:
        self.num_export_calls += 1
        self.targets.append(target)
        if peer in self.silent_peers:
            return len(hashes)
        node = self.peers.get(peer)
        if node is None:
            return None
        return await node.export_kv(list(hashes), target, transfer_id)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
