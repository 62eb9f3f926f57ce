"""One exchange and its helpers: classify, hold for a permit, go upstream (or to the cache), relay, report."""
