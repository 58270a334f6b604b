"""Rollout: engines, prompts and responses as tokens, tasks and verifiers, log-probs, and the rollout stages."""
