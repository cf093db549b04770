"""vLLM request fields whose meaning Tessera does not serve yet. They are declared, so a request
that asks for one gets a 400 naming it: an unknown field is accepted and ignored (the
``tessera-ignored-fields`` header), which is right only for fields that change nothing in the
output. Their defaults (what a client sends when it asks for nothing) pass."""

from __future__ import annotations

from pydantic import Field, model_validator

from services.gateway.wire_base import WireModel


class UnservedFields(WireModel):
    use_beam_search: bool = Field(False, description="not served yet: true is a 400")

    @model_validator(mode="after")
    def _unserved(self) -> UnservedFields:
        asked = {"use_beam_search": self.use_beam_search}
        unserved = [name for name, on in asked.items() if on]
        if unserved:
            raise ValueError(f"{unserved[0]} is not supported by this server yet")
        return self
