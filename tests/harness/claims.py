"""What a client must do against a coordinator without CommitClaimService (an older release)."""

from __future__ import annotations

import pytest

from snapcoord.client import CoordinatorClient, Unimplemented, Unsupported


def assert_claims_unsupported(client: CoordinatorClient) -> None:
    """Every claim RPC raises ``Unsupported`` (an ``Unimplemented``) naming 0.4.0, after one
    attempt: never retried, never answered by anything weaker."""
    calls = (
        lambda: client.fence_table("t", 1, 0),
        lambda: client.claim_commit("t", 0, 1, "a"),
        lambda: client.get_commit_claims("t"),
    )
    for call in calls:
        with pytest.raises(Unsupported, match=r"needs snapcoord 0\.4\.0 or newer") as old:
            call()
        assert isinstance(old.value, Unimplemented) and old.value.code == "UNIMPLEMENTED"
        assert (old.value.required_version, old.value.attempts) == ("0.4.0", 1)
