"""The composite recipe: a harness step and a weights step in one evolve run."""
