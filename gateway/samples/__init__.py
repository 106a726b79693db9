"""Recorded sessions -> training samples (the trainer and `turnstile export` read these).

Import from here: the built-in styles register themselves on import.
"""

from gateway.samples import concat, individual  # noqa: F401  (register their styles)
from gateway.samples.registry import (
    EXPORT_STYLES,
    ExportStyle,
    check_export_style,
    export_session,
    register_export_style,
)
from gateway.samples.returns import discounted_returns
from gateway.samples.sample import NoRewardError, Sample, sampling_temperature, trainable

__all__ = [
    "EXPORT_STYLES",
    "ExportStyle",
    "NoRewardError",
    "Sample",
    "check_export_style",
    "discounted_returns",
    "export_session",
    "register_export_style",
    "sampling_temperature",
    "trainable",
]
