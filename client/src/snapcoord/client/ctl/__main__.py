"""``python -m snapcoord.client.ctl``: the same as ``snapcoordctl``."""

from __future__ import annotations

from snapcoord.client.ctl._main import main

raise SystemExit(main())
