"""How much of a growing text to hold back from a stream: the longest tail that could still grow
into one of ``markers`` (a stop string, a tool-call tag), so nothing sent is later taken back."""

from __future__ import annotations


def num_held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest
