"""TTT-Discover (arXiv 2601.16175): test-time RL on one problem, trained a full step grid at a
time with entropic leave-one-out advantages, an adaptive β, centred KL shaping to the frozen
base and an un-clipped importance-sampling loss (the TTT-Discover paper). The recipe class is
`recipes.tttd.recipe:TTTDRecipe` (short name `tttd`)."""
