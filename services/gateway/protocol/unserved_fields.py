"""vLLM request fields whose meaning Tessera does not serve: the tables of the values that ask for
nothing, and how such a field is declared (``off``) and refused (``refuse_asked``); each request
model declares its own (sampling_request.py, chat.py, completion.py). Declared, a request that
asks for one gets a 400 naming it: an unknown field is accepted and ignored (the
``tessera-ignored-fields`` header), which is right only for fields that change nothing in the
output. What a client sends when it asks for nothing (the field's vLLM default, null, or an empty
list) passes.

The audit against vLLM's request models (chat and text completions, read from vLLM's source as
committed under benchmarks/peers/vllm_tests/ by tests/services/gateway/protocol/test_unserved_fields.py):
every field is served, refused here, or changes nothing in the output and is ignored by name
(OUTPUT_NEUTRAL). vLLM's disaggregation hand-offs are served on chat where they decide the output
(``kv_transfer_params.prompt_token_ids``: chat.py) and refused otherwise.
"""

from __future__ import annotations

from pydantic import Field

from services.gateway.protocol.wire_base import WireModel

# vLLM request fields that change nothing in the output, so they are accepted and ignored (and
# named in the ``tessera-ignored-fields`` header, as every undeclared field is). Field -> why.
OUTPUT_NEUTRAL: dict[str, str] = {
    "request_id": "an id for the server's logs",
    "session_id": "an id for the server's logs",
    "stream_interval": "how tokens are grouped into chunks, not which",
    "include_reasoning": "no served model has a reasoning parser",
    "routed_experts_prompt_start": "mixture-of-experts models only",
}

# Field -> the values that ask for nothing.
SHARED_DEFAULTS: dict[str, tuple[object, ...]] = {
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "bad_words": (None, []),
    "priority": (0,),  # as vLLM without priority scheduling
    "return_token_offsets": (False,),
    "mm_payload": ("tensors",),
    "return_mm_kwargs": (None, False),
    "watermarking": (None,),
    "repetition_detection": (None,),
    "thinking_token_budget": (None,),
    "vllm_xargs": (None, {}),
    "ec_transfer_params": (None,),
}
CHAT_DEFAULTS: dict[str, tuple[object, ...]] = {
    "add_special_tokens": (False,),  # the template writes any BOS itself
    "reasoning_effort": (None,),
    "documents": (None, []),
    "chat_template": (None,),
    "media_io_kwargs": (None, {}),
    "return_prompt_text": (None, False),
}
COMPLETION_DEFAULTS: dict[str, tuple[object, ...]] = {
    "add_special_tokens": (True,),
    "prompt_embeds": (None,),
    "kv_transfer_params": (None,),  # a raw prompt's ids are its prompt already (chat: chat.py)
}


def refuse_asked(model: WireModel, defaults: dict[str, tuple[object, ...]]) -> None:
    """A 400 (raised as a validation error) naming the first field ``model`` asks something of."""
    for name, idle in defaults.items():
        value = getattr(model, name)
        if value not in idle:
            raise ValueError(f"{name}={value!r} is not supported by this server (only {idle[0]!r} is)")


def off(name: str, defaults: dict[str, tuple[object, ...]] = SHARED_DEFAULTS):
    """The declaration of an unserved field: its idle value as default, documented as such."""
    idle = defaults[name]
    return Field(idle[0], description=f"not served: only {idle[0]!r}" + (" or " + repr(idle[1]) if len(idle) > 1 else ""))
