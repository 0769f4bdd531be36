"""Recordings and diagnosis bundles: one versioned, streamable, crash-safe file format.

``writer.BundleWriter`` writes, ``reader.read_file`` / ``reader.load_model`` read,
``replay_source.ReplaySource`` replays, ``export.export_bundle`` collects a live job.
"""
