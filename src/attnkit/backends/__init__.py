"""Attention backends behind one signature, and the router that picks the fastest capable one."""

from attnkit.backends.dispatch import attention, explain
from attnkit.backends.registry import Explanation, available, get, register, select

__all__ = ["attention", "explain", "available", "get", "register", "select", "Explanation"]
