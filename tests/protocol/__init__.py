"""Protocol tier: the sans-I/O core, driven with bytes alone."""
