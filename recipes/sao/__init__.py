"""SAO (Single-rollout Asynchronous Optimization, arXiv 2607.07508): one scored rollout, one
update, a value model for advantages and a hard double-sided trust band against the recorded
sampling log-probs (the SAO paper). The recipe class is `recipes.sao.recipe:SAORecipe`."""
