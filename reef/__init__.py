"""Reef: infrastructure for agents that improve themselves from their own traffic."""

__version__ = "0.1.0"
