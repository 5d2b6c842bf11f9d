"""What every aggregate shares: ``decision`` (the pure types a decide function returns),
``commit`` (the kernel that runs one against the store, with ``intents``, the ``intent_pool`` and
the ``expiry_index``), the in-memory ``record_copies``, ``orphans`` sweeps, ``payload_admission``
(memory held by payloads) and ``janitor_loop`` (the janitor's steps, run by the elected replica)."""
