"""Training: the RL trainer's loop, its optimizer, data-parallel wrappers, checkpoints, logging and evaluation."""
