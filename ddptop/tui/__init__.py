"""The Textual dashboard: ``DdptopApp`` wires a :class:`~ddptop.source.JobSource` to widgets.

Pure helpers (rows, sorting, filtering, stack grouping) live beside the app so that they
can be tested without a terminal; the desync marks are the diagnosis's
(:mod:`ddptop.diagnosis.desync`).
"""
