"""The LLM side: lifts posttrain's estimators onto causal language models (needs the ``[llm]`` extra)."""
