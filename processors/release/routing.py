"""Sticky routing lives in the contract (``schemas.release_routing``) so the gateway can route by it; the
release core re-exports it under its old name."""

from schemas.release_routing import route, session_point

__all__ = ["route", "session_point"]
