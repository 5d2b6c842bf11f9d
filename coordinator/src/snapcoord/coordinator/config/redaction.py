"""Redaction: what a configuration value looks like in a log line or ``check-config``'s output.

Only the standard library, so that ``options`` (which names the redaction of each option) and
``settings`` can both use it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SECRET_PARAM_RE = re.compile(r"pass|secret|token|key|credential|auth", re.IGNORECASE)


def redact_uri(uri: str) -> str:
    """``uri`` with the password of any ``user:password@`` part, and the values of query parameters
    that look like secrets, replaced by ``***``; safe to log."""
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        # "user:password@" keeps the user; a bare "token@" may itself be the secret.
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}" if ":" in userinfo else f"***@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if _SECRET_PARAM_RE.search(k) else v) for k, v in pairs], safe="*/:,")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
