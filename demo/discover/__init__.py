"""TTT-Discover's environment side: a client of Reef that searches for circle packings with a
PUCT archive, runs each proposed program in a sandbox, verifies it exactly and reports the
verified score against its receipt with step-grid metadata (the TTT-Discover paper)."""
