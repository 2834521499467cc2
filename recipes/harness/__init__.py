"""The harness recipe: GEPA over the harness tree, episodes on the served weights, a proposer."""
