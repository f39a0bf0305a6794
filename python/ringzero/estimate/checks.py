"""Argument checks shared by the estimator's dataclasses: one message shape for every bad number."""
from __future__ import annotations


def positive_ints(owner: str, **values) -> None:
    """Raises ValueError naming `owner.name` unless every value is an int >= 1 (bool is not a count)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{owner}{name} must be a positive int, got {v!r}")
