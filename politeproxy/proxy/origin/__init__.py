"""The upstream client, the project's own: every method, pooled connections, answers streamed."""
