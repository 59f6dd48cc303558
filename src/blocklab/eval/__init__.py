"""Evaluation of checkpoints: validation loss now; probes (NIAH, lost-in-the-middle) next."""
