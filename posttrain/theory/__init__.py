"""Analytic results of the papers (escape times, information matrices, bounds, FLOP accounting).

One module per result family; data first, keyword-only options, frozen result dataclasses.
"""
