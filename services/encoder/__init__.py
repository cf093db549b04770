"""The encoder role: the vision tower behind an encoder-output cache."""
