"""pacing layer."""
