"""The process: ``app`` assembles and runs a server from a ``Config``, ``services`` builds what the
servicers and the janitor work on, ``processes`` supervises ``--processes N`` workers (with
``shared_metrics`` for their counters), plus CPU counting, malloc tuning, the plain-TCP health
listener and the ``snapcoord health`` probe."""
