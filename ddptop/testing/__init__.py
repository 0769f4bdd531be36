"""ddptop's test kit: fake ranks, synthetic jobs and synthetic recordings.

Tests, benches and screenshot generation use it to drive the real viewer, client and
bundle code with thousands of ranks no machine here could run. It is shipped so that
``python -m ddptop.testing.synthetic`` works after a plain install, but nothing in the
product imports it: an import-linter contract in pyproject.toml forbids that, so a fake
can never end up in a rank or a viewer.
"""
