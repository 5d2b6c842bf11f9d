"""Access control: who is calling (tokens, client certificates) and what they may do.

``policy`` is the pure part (principals, roles, scopes, decisions; no I/O), ``rules`` the per-RPC
table of the ids a request touches, ``authfile`` loads and re-reads the auth file, ``tls`` builds
the rotating server credentials, ``interceptor`` applies all of it to every call, and ``audit``
writes one line per mutating call.
"""
