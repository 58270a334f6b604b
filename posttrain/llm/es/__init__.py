"""Evolution strategies on a causal LM: the ES trainer and the in-place parameter machinery it runs on."""
