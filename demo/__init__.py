"""A learning demo: a simulated app states a preference, reports feedback, and Reef learns it.

`python -m demo` (or `make demo`) serves SmolLM2 with `reef serve`, asks questions through the
official openai SDK with "answer in at most five words" in the system prompt, reports each
answer (a correction when it broke the preference), waits for each new release, and measures
the pass rate on held-out questions after every release: the learning curve.
"""
