"""Settings, loading, overrides from flags and env, paths, start-up checks."""
