"""The wire models of vLLM's runtime LoRA endpoints, /v1/load_lora_adapter and /v1/unload_lora_adapter."""

from __future__ import annotations

from pydantic import Field

from services.gateway.protocol.wire_base import NonEmptyStr, WireModel


class LoadLoraAdapterRequest(WireModel):
    lora_name: NonEmptyStr
    lora_path: NonEmptyStr = Field(description="a PEFT adapter directory every prefill and decode node can read")
    load_inplace: bool = Field(False, description="replace an adapter already served under this name")


class UnloadLoraAdapterRequest(WireModel):
    lora_name: NonEmptyStr
    lora_int_id: int | None = Field(None, description="vLLM's; accepted and not needed")
