"""The recording store: ``docs/recording.md``."""
