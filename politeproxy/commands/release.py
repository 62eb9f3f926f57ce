"""``politeproxy release HOST``: lift a host's hold or backoff now, for every proxy sharing the store.

It asks the proxy's admin endpoint (``POST /release?host=HOST``, loopback or an allowed admin client only,
the same door as ``/status``); the proxy clears the host's record in the store, notes who released it,
and every proxy on the store drops its own hold within a second. The header
``X-Politeproxy-Release: 1`` is required, so a web page in the operator's browser cannot send it.
"""

from __future__ import annotations

import sys
from urllib.parse import quote

from politeproxy.observe.statusview import StatusError, admin_call

HEADER = {"X-Politeproxy-Release": "1"}


def main(url: str, host: str, token: str = "") -> int:
    """``token``: the ``[admin]`` token, sent as a Bearer token when the proxy asks for one."""
    headers = HEADER | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        doc = admin_call(url, f"/release?host={quote(host, safe='')}", "POST", headers)
    except StatusError as e:
        print(f"politeproxy release: {e}", file=sys.stderr)
        return 1
    hosts = doc.get("released")
    names = ", ".join(str(h) for h in hosts) if isinstance(hosts, list) else host
    was = doc.get("was")
    held = "; it was held: " + "; ".join(str(w) for w in was) if isinstance(was, list) and was else ""
    print(f"released {names}{held}")
    return 0
