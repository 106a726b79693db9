"""Turnstile gateway: an OpenAI-compatible front door that records every completion for RL."""

__version__ = "0.1.0"
