"""The coordinator's configuration: ``settings`` (the sections a process runs with, and loading
them from flags and environment) and ``options`` (the one table of options and its parsers)."""
