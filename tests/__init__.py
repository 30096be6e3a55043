"""The test suite (a package, so its modules import each other as ``tests.*``)."""
