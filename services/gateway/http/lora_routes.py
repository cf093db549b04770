"""vLLM's runtime LoRA endpoints, mounted only under its switch (VLLM_ALLOW_RUNTIME_LORA_UPDATING):
thin, they call services/gateway/frontend/adapter_updates.py and answer as vLLM does (plain text)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from services.gateway.frontend.adapter_updates import AdapterUpdates
from services.gateway.frontend.frontend import Frontend
from services.gateway.http.api_routes import FrontendDep, caller_of
from services.gateway.protocol.lora import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from services.gateway.protocol.responses import ErrorResponse

lora_router = APIRouter()
RESPONSES = {status: {"model": ErrorResponse} for status in (400, 401, 404)}


def _updates(frontend: Frontend) -> AdapterUpdates:
    return AdapterUpdates.for_pipeline(frontend.config.adapters, frontend.state.pipeline)


@lora_router.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=RESPONSES, dependencies=[Depends(caller_of)])
async def load_lora_adapter(request: LoadLoraAdapterRequest, frontend: FrontendDep) -> str:
    return await _updates(frontend).load(request.lora_name, request.lora_path, inplace=request.load_inplace)


@lora_router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=RESPONSES, dependencies=[Depends(caller_of)])
async def unload_lora_adapter(request: UnloadLoraAdapterRequest, frontend: FrontendDep) -> str:
    return await _updates(frontend).unload(request.lora_name)
