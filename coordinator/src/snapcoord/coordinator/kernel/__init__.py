"""The commit machinery every aggregate shares: ``commit`` (the kernel that runs a decide function
against the store, with ``intents``, the ``intent_pool`` and the ``expiry_index``), the in-memory
``record_copies``, ``orphans`` collection and ``payload_admission`` (memory held by payloads)."""
