"""Backlog tracking: ``layout`` (where marks and progress live, and why), ``decide`` (the pure
rules of each change), ``registry`` (the BacklogService logic), ``cache`` (boundaries in memory),
``janitor`` (orphan sweep, gauges). The rules of progress itself are in ``domain.backlog``."""
