"""Producer offset snapshots: ``layout`` (where things are stored), ``decide`` (the pure rules of
each change), ``registry`` (the ProducerOffsetService logic), ``janitor`` (expiry, orphans)."""
