"""One dashboard widget per module."""
