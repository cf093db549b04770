"""The base of every request model at the HTTP edge, apart so that request parts in their own
modules (structured_fields.py) and chat.py can share it without importing each other."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]


class WireModel(BaseModel):
    """Requests: unknown fields are kept aside to be reported (frontend/openai_api.py), and nothing is
    coerced ("yes" is not a bool, 2.0 is not an int, NaN is not a temperature)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False, populate_by_name=False)
