"""Ratio benchmarks of the core estimators, each against a reference measured in the same run.

Run ``python -m benchmarks`` (``make bench``). Absolute times depend on the machine and its load;
the result is the ratio to a straightforward reference implementation timed interleaved with ours
in the same process. See ``benchmarks/__main__.py`` for the options.
"""
