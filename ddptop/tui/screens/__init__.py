"""Screens pushed over the dashboard: rank detail, stacks, help, filter prompt."""
