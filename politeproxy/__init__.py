"""politeproxy: one request budget for every Common Crawl pipeline on a machine, or on many."""

__version__ = "0.1.0"
