"""Offline tools: tiny models for tests, checkpoint edits (SAR, merges), real-model preparation, FLOP estimates."""
