"""``python -m posttrain``: the same command line as the ``posttrain`` script."""

from posttrain.cli import main

if __name__ == "__main__":
    main()
