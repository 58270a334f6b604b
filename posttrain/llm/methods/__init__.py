"""Methods: the ``Algorithm`` bundle, the bundles of methods beyond a preset, and the catalog of methods by name."""
