"""This client against the oldest release's coordinator (0.1.0, built from its commit): the calls
0.1.0 has work; the RPCs it lacks answer UNIMPLEMENTED, which the client raises as
``Unimplemented`` naming the RPC; its errors carry no reasons, so they map to the class of their
code alone (CHANGELOG 0.2.0: "errors without reasons")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.claims import assert_claims_unsupported
from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient
from upgrades import client_calls
from upgrades.installed import InstalledRelease, install
from upgrades.releases import find

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def oldest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    release: InstalledRelease = install(find("0.1.0"))
    process = CoordinatorProcess(tmp_path_factory.mktemp("oldest"), command=[str(release.snapcoord)])
    process.start()
    try:
        yield process
    finally:
        process.kill()


def test_this_client_against_the_oldest_coordinator(oldest: CoordinatorProcess) -> None:
    with CoordinatorClient(oldest.target, timeout_s=60) as client:
        results = client_calls.run(client, client, "oldest")
    lacking = {"AdvanceProducerOffsets", "UploadCheckpoint"}
    for step in lacking:
        assert results[step].startswith(
            f"Unimplemented UNIMPLEMENTED: UNIMPLEMENTED: Method not found! ({step})"
        )
    # A lease-held refusal without its reason is a plain FailedPrecondition, not LeaseHeld.
    assert results["DeleteSnapshot@read while leased"].startswith(
        "MISMATCH: FailedPrecondition FAILED_PRECONDITION"
    )
    # What follows from the missing advance: its record was never written.
    follows = {
        "GetProducerOffsets@read after advance",
        "DeleteProducerOffsets",
        "DeleteSnapshot@read while leased",
    }
    worked = {step: result for step, result in results.items() if step not in lacking | follows}
    assert len(worked) >= 20 and set(worked.values()) == {"OK"}, worked


def test_the_commit_claim_rpcs_against_an_older_coordinator_name_the_release_they_need(
    oldest: CoordinatorProcess,
) -> None:
    """A real coordinator without CommitClaimService: every claim RPC raises ``Unsupported`` (an
    ``Unimplemented``) naming 0.4.0 at once, so a sink refuses it instead of committing without."""
    with CoordinatorClient(oldest.target, timeout_s=60) as client:
        assert_claims_unsupported(client)
