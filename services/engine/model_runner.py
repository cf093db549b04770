"""Executes one scheduled step: run the vision tower for newly scheduled images, merge image
embeddings into the token embeddings, run the decoder over the packed batch, and return the final
hidden state of every request whose scheduled range reaches its last token (it samples this step:
the Sampler chooses its token, services/engine/sampling.py; or, an embedding request, it is pooled:
services/engine/pooler.py), the prompt rows CLS and MEAN pooling read, and, for a request that asks for
prompt logprobs, the hidden states of the prompt positions the step computed (``StepHidden.prompt_rows``:
services/engine/prompt_logprobs.py scores them).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from kernels.cpu_linear import packing_available
from kernels.selector import create_backend
from services.engine.attention_inputs import layer_attention_inputs, new_kv_storage
from services.engine.config import EngineConfig
from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.kv.layout import KVLayout
from services.engine.kv.recurrent_state import StateStorage, new_state_storage
from services.engine.lora.slots import LoraSlots
from services.engine.prompt_logprobs import PromptRows, prompt_rows_of
from services.engine.request import Request
from services.engine.scheduler import SchedulerOutput
from services.models.checkpoint import COMPUTE_DTYPE, load_weights
from services.models.family import VisionEncoder
from services.models.lora.adapter import LoraAdapter
from services.models.lora.bank import LoraBank, SlotRows
from services.models.lora.tower import TowerLoras
from services.models.registry import ModelRef
from shared.types import MmHash


@dataclass(slots=True)
class StepHidden:
    requests: list[Request]  # those that sample this step
    hidden: torch.Tensor  # [len(requests), hidden_size]: each one's last row
    prompt_rows: list[PromptRows] = field(default_factory=list)  # of requests that ask for prompt logprobs
    pool_rows: list[PromptRows] = field(default_factory=list)  # prompt rows of CLS / MEAN embedding requests (pooler.py)


class ModelRunner:
    def __init__(self, model: ModelRef, config: EngineConfig, *, load_vision: bool = True) -> None:
        self.device = torch.device(config.device)
        self.dtype = COMPUTE_DTYPE
        self.family = model.family
        self.checkpoint = self.family.read_config(model.path)
        text_weights, vision_weights = load_weights(model.path, self.dtype, self.family.weight_group)
        self.decoder = self.family.build_decoder(self.checkpoint, text_weights)
        self.decoder.to(self.device).eval()
        if config.prepack_weights and self.device.type == "cpu" and packing_available():
            self.decoder.pack_for_cpu(screen_greedy=config.screen_greedy)
        # LoRA: the decoder's linear layers wrapped once, each slot's adapter applied to its rows.
        self.text_loras: LoraBank | None = None
        if config.enable_lora:
            self.text_loras = LoraBank(config.max_loras, "text", config.max_lora_rank, self.device)
            self.text_loras.attach(self.decoder.layers, prefix="layers")
        # A node that receives embeddings from an encoder node loads no vision tower.
        self.vision: VisionEncoder | None = None
        self.tower_loras: TowerLoras | None = None  # adapters on the tower and projector, one per pass
        if load_vision:
            self.vision = self.family.build_vision(self.checkpoint, vision_weights, self.dtype, self.device, prepack=config.prepack_vision)
            if config.enable_lora:
                self.tower_loras = TowerLoras(self.vision.module, config.max_loras, config.max_lora_rank, self.device)
        text = self.checkpoint.shape
        windows = {layer: text.layer_windows[layer] if config.sliding_window_kv else None for layer in text.kv_layers}
        self.layout = KVLayout.of_layers(windows)
        # A hybrid model's per-request state: slots carved from the KV budget first.
        self.num_state_slots = self.num_state_snapshots = 0
        self.states: StateStorage | None = None
        self.snapshots: StateStorage | None = None  # saved states that prefix hits restore
        reserved = 0
        if text.state is not None:
            state_bytes = text.state.bytes_per_request()
            self.num_state_slots, self.num_state_snapshots = config.resolve_num_state_slots(state_bytes)
            self.states = new_state_storage(text.state, self.num_state_slots, self.device)
            self.snapshots = new_state_storage(text.state, self.num_state_snapshots, self.device)
            reserved = (self.num_state_slots + self.num_state_snapshots) * state_bytes
        # KV pages, each holding layout.num_slots layers (every layer when all are alike).
        self.num_kv_blocks = config.resolve_num_kv_blocks(
            num_layers=self.layout.num_slots, num_kv_heads=text.num_kv_heads, head_dim=text.head_dim, dtype_bytes=4, reserved_bytes=reserved
        )
        self.kv_caches = new_kv_storage(self.layout, self.num_kv_blocks, config.block_size, text, self.dtype, self.device)
        self.backend = create_backend(config.attention_backend, self.device, needs_masks=self.family.bidirectional_images)
        self.block_size = config.block_size
        # mm_hash -> embeddings; residency is decided by the EncoderCacheManager.
        self.encoder_outputs: dict[MmHash, torch.Tensor] = {}

    def drop_encoder_outputs(self, mm_hashes: list[MmHash]) -> None:
        for mm_hash in mm_hashes:
            self.encoder_outputs.pop(mm_hash, None)

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, kv: KVCacheManager, loras: LoraSlots | None = None) -> StepHidden:
        self._run_encoder(step)
        slot_rows = self._lora_rows(step, loras)
        token_ids: list[int] = []
        positions: list[torch.Tensor | range] = []
        merges: list[tuple[int, torch.Tensor]] = []  # (row in batch, embedding rows)
        sample_rows, sample_requests = [], []
        prompt_spans: list[tuple[Request, range, int]] = []  # (request, positions predicting a prompt token, first one's row)
        pool_spans: list[tuple[Request, range, int]] = []  # (request, prompt positions it pools, first one's row)
        for item in step.scheduled:
            request, start = item.request, item.request.num_computed_tokens
            end = start + item.num_new_tokens
            row0 = len(token_ids)
            token_ids.extend(request.token_ids()[start:end])
            generated = start >= request.num_prompt_tokens
            positions.append(request.generated_positions(start, end) if generated else request.positions(start, end))
            for feature in request.mm_features:
                lo, hi = max(start, feature.placeholder.offset), min(end, feature.placeholder.end)
                if lo < hi:
                    rows = self.encoder_outputs[feature.mm_hash][lo - feature.placeholder.offset : hi - feature.placeholder.offset]
                    merges.append((row0 + lo - start, rows))
            if end == request.num_tokens:
                sample_rows.append(len(token_ids) - 1)
                sample_requests.append(request)
            if predicting := prompt_rows_of(request, start, end):
                prompt_spans.append((request, predicting, row0))
            if request.pooling is not None and request.pooling.reads_every_row and start < request.num_prompt_tokens:
                pool_spans.append((request, range(start, min(end, request.num_prompt_tokens)), row0))

        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        inputs = self.decoder.prepare_inputs(ids, merges)
        spans = self._image_spans(step) if self.family.bidirectional_images else None
        layer_kv = layer_attention_inputs(step, kv, self.kv_caches, self.backend, self.checkpoint.shape, spans, self.states)
        self.save_states(kv)
        self._restore_states(kv)
        self._clear_fresh_states(step, kv)
        with self.text_loras.rows(slot_rows, len(token_ids)) if self.text_loras is not None else contextlib.nullcontext():
            hidden = self.decoder(inputs, _positions_tensor(positions).to(self.device), layer_kv, self.backend)
        prompt_rows = [PromptRows(request, span.start, hidden[row0 : row0 + len(span)]) for request, span, row0 in prompt_spans]
        pool_rows = [PromptRows(request, span.start, hidden[row0 : row0 + len(span)]) for request, span, row0 in pool_spans]
        if not sample_rows:
            return StepHidden([], torch.empty(0), prompt_rows, pool_rows)
        return StepHidden(sample_requests, hidden[torch.tensor(sample_rows, device=self.device)], prompt_rows, pool_rows)

    def _lora_rows(self, step: SchedulerOutput, loras: LoraSlots | None) -> SlotRows:
        """Load adapters newly given slots, then each slot's rows in this step's packed batch."""
        if loras is None or self.text_loras is None:
            return []
        loads, loras.pending_loads = loras.pending_loads, []
        for slot, adapter in loads:
            try:
                self.text_loras.load(slot, adapter)
            except Exception:  # refused (checked at admission, so not expected): no request may run on its slot
                loras.discard(adapter)
                raise
        slot_to_rows: dict[int, list[int]] = {}
        row = 0
        for item in step.scheduled:
            slot = loras.slot_of(item.request)
            if slot is not None:
                slot_to_rows.setdefault(slot, []).extend(range(row, row + item.num_new_tokens))
            row += item.num_new_tokens
        return [(slot, torch.tensor(rows, dtype=torch.long, device=self.device)) for slot, rows in slot_to_rows.items()]

    def save_states(self, kv: KVCacheManager) -> None:
        """Copy the states the KV manager chose to keep into their snapshots. A saved slot is
        untouched until the next forward, so this runs at any time before it (and before any
        restore: a hit may name a snapshot whose save is still pending)."""
        for slot, snapshot in kv.pending_saves:
            self._copy_state(self.states, slot, self.snapshots, snapshot)
        kv.pending_saves.clear()

    def _restore_states(self, kv: KVCacheManager) -> None:
        """Requests admitted on a prefix hit start from the state saved at its end."""
        for slot, snapshot in kv.pending_restores:
            self._copy_state(self.snapshots, snapshot, self.states, slot)
        kv.pending_restores.clear()

    @staticmethod
    def _copy_state(source: StateStorage | None, index: int, target: StateStorage | None, target_index: int) -> None:
        assert source is not None and target is not None
        for (conv, recurrent), (to_conv, to_recurrent) in zip(source, target):
            to_conv[target_index].copy_(conv[index])
            to_recurrent[target_index].copy_(recurrent[index])

    def _clear_fresh_states(self, step: SchedulerOutput, kv: KVCacheManager) -> None:
        """A request computing from token 0 starts from a zero state, whoever held its slot."""
        if self.states is None:
            return
        fresh = [kv.state_slot(item.request) for item in step.scheduled if item.request.num_computed_tokens == 0]
        if not fresh:
            return
        slots = torch.tensor(fresh, dtype=torch.long, device=self.device)
        for conv, recurrent in self.states:
            conv.index_fill_(0, slots, 0.0)
            recurrent.index_fill_(0, slots, 0.0)

    @staticmethod
    def _image_spans(step: SchedulerOutput) -> list[list[tuple[int, int]]]:
        return [[(f.placeholder.offset, f.placeholder.end) for f in item.request.mm_features] for item in step.scheduled]

    def _run_encoder(self, step: SchedulerOutput) -> None:
        """Encode the step's newly scheduled images: one tower pass per LoRA adapter that changes
        the tower (its images carry mm_hashes of their own), one for all the others."""
        passes: dict[str | None, tuple[LoraAdapter | None, dict[MmHash, tuple[torch.Tensor, tuple[int, int, int]]]]] = {}
        for item in step.scheduled:
            adapter = item.request.lora if item.request.lora is not None and item.request.lora.touches_tower else None
            pending = passes.setdefault(adapter and adapter.fingerprint, (adapter, {}))[1]
            for index in item.encoder_inputs:
                feature = item.request.mm_features[index]
                if feature.mm_hash in self.encoder_outputs or feature.mm_hash in pending:
                    continue
                if feature.pixel_values is None:
                    raise RuntimeError(f"image {feature.mm_hash} must be encoded but its pixels were not sent")
                pending[feature.mm_hash] = (feature.pixel_values, feature.grid_thw)
        for adapter, pending in passes.values():
            if not pending:
                continue
            if self.vision is None:
                raise RuntimeError("this node has no vision tower; embeddings must be imported before scheduling")
            with self.tower_loras.running(adapter) if self.tower_loras is not None else contextlib.nullcontext():
                outputs = self.vision.encode([p for p, _ in pending.values()], [g for _, g in pending.values()])
            for mm_hash, embeds in zip(pending, outputs):
                self.encoder_outputs[mm_hash] = embeds


def _positions_tensor(pieces: list[torch.Tensor | range]) -> torch.Tensor:
    """(3, rows) positions from each scheduled item's: a (3, n) tensor, or a range of generated
    tokens' positions (the same on all three axes). A run of ranges (a decode step's every row)
    becomes one tensor, not one per request."""
    tensors: list[torch.Tensor] = []
    run: list[int] = []
    for piece in pieces:
        if isinstance(piece, range):
            run.extend(piece)
            continue
        if run:
            tensors.append(torch.tensor(run, dtype=torch.long).expand(3, -1))
            run = []
        tensors.append(piece)
    if run:
        tensors.append(torch.tensor(run, dtype=torch.long).expand(3, -1))
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=1)
