"""policy layer."""
