"""One client TLS context per trust bundle, kept while the file is unchanged.

Loading a proxy's bundle (its CA plus the public roots, about 250 KB) costs about 0.1 s of CPU, and the
end-to-end tests make hundreds of one-request connections through CONNECT: each loaded it again.
"""

from __future__ import annotations

import ssl
from functools import lru_cache
from pathlib import Path


def client_context(cafile: str | Path) -> ssl.SSLContext:
    """A verifying client context trusting ``cafile`` only; the same object until the file changes."""
    st = Path(cafile).stat()
    return _context(str(cafile), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _context(cafile: str, mtime_ns: int, size: int) -> ssl.SSLContext:
    # mtime and size are in the key so a bundle rewritten in place (a new CA) is loaded again.
    return ssl.create_default_context(cafile=cafile)
