"""The process: ``app`` builds and runs a server from a ``Config`` (on the ``services`` the
package root assembles), ``worst_requests`` refuses limits under which a call would not fit one
ZooKeeper request, ``processes`` supervises ``--processes N`` workers (with ``shared_metrics``
for their counters), plus CPU counting, malloc tuning, the plain-TCP health listener and the
``snapcoord health`` probe."""
