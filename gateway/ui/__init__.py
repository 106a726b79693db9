"""The session viewer and run dashboard (/ui)."""

from gateway.ui.routes import router

__all__ = ["router"]
