"""The decode role's settings: its pacing rule (shared/colocation/step_pacing.py) is checked when
the settings are made."""

from __future__ import annotations

import pytest

from services.decode.main import Settings
from shared.colocation.step_pacing import PacingRule


@pytest.mark.parametrize(
    "setting", [{"yield_step_ms": -1}, {"yield_backlog": 0}, {"yield_ready": 0}, {"yield_step_ms": 300, "yield_max_step_ms": 250}]
)
def test_the_decode_role_refuses_a_rule_that_cannot_pace(setting):
    with pytest.raises(ValueError, match="yield_"):
        Settings(**setting)
    assert Settings().pacing_rule() == PacingRule()  # the role's defaults are the rule's
