"""Helpers for the dashboard tests: fake sources and tiny probes."""
