"""What counts as a reward value, for the REST API and for agents' return values alike."""

from __future__ import annotations

import math
from typing import Any


def finite_reward(value: Any) -> float | None:
    """The reward as a float: a finite bool, int, float or numpy scalar; None otherwise."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            return None
        if not isinstance(value, np.generic):
            return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):  # e.g. an int too large for a float
        return None
    return number if math.isfinite(number) else None
