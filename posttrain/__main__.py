"""``python -m posttrain``: the same command line as the ``posttrain`` script.

``python -m`` puts the working directory first on the import path; it is taken off before anything else is
imported, so a file in the directory a command runs from (say a ``math_verify.py`` or a ``rewards.py`` next to
a config) never shadows a library or runs as a side effect. A reward function (``data.reward``) is imported
from the installed packages and ``PYTHONPATH``, as the ``posttrain`` script imports it.
"""

import os
import sys


def _drop_working_directory(path: list[str]) -> None:
    """Remove ``path[0]`` when it is the working directory (``""`` or its absolute path), as ``python -m`` adds it."""
    if path and not getattr(sys.flags, "safe_path", False):
        head = path[0]
        if head == "" or os.path.abspath(head) == os.getcwd():
            del path[0]


_drop_working_directory(sys.path)

from posttrain.cli import main  # noqa: E402  (after the import path is fixed)

if __name__ == "__main__":
    main()
