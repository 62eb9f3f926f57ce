"""What the proxy shows: metrics, logs, the status document, page and terminal view, admin routes."""
