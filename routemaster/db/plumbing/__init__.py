"""The database's own plumbing, apart from the statements: where it is and the engine
(``database``), the embedded PostgreSQL (``embedded``), migrations (``migrate``)."""
