"""The shared disk cache of immutable Common Crawl objects (issue 14): blocking I/O, run in threads."""
