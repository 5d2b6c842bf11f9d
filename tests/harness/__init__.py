"""Test harness: real ZooKeeper and S3 (SeaweedFS) servers on loopback, and fault injection helpers.

The pytest fixtures built on these live in tests/conftest.py; this package has no pytest dependency so
scripts (bench/, manual debugging) can start the same servers.
"""

from __future__ import annotations

from harness.ensemble import ZooKeeperEnsemble
from harness.faults import TcpProxy, drop_zk_connection, expire_zk_session
from harness.ports import free_port, free_port_block, is_port_free
from harness.process import HarnessError, PortInUseError, ServerStartError
from harness.seaweed import SeaweedS3Server
from harness.zookeeper import ZooKeeperServer

__all__ = [
    "HarnessError",
    "PortInUseError",
    "SeaweedS3Server",
    "ServerStartError",
    "TcpProxy",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "drop_zk_connection",
    "expire_zk_session",
    "free_port",
    "free_port_block",
    "is_port_free",
]
