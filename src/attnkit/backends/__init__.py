"""Attention backends behind one signature, and the router that picks the fastest capable one."""

from attnkit.backends.base import Rank
from attnkit.backends.dispatch import attention, explain
from attnkit.backends.registry import Explanation, available, get, ranking, register, select, unregister

__all__ = ["attention", "explain", "available", "get", "register", "unregister", "select", "ranking", "Rank",
           "Explanation"]
