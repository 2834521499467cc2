"""Modules that vLLM's own server imports: a vLLM Reef launches has this directory on its
PYTHONPATH. They run in vLLM's process and environment, so they use the standard library only
and never import reef."""
