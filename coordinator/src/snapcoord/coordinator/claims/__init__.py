"""Commit claims (CommitClaimService): ``layout`` (where tables and claims live and why),
``decide`` (the rules of each change), ``registry`` (the operations on the commit kernel) and the
janitor's step in ``registry.CommitClaimRegistry.clean``."""
