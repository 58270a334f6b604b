"""Toy environments that know their exact answers (bandits, tabular autoregressive policies, ...)."""
