"""OpenClaw-RL: learning from next-state signals (recipe.py says how)."""
