"""The Textual dashboard: ``DdptopApp`` wires a :class:`~ddptop.source.JobSource` to widgets.

Pure helpers (rows, sorting, filtering, desync marks, stack grouping, fallback findings)
live beside the app so that they can be tested without a terminal.
"""
