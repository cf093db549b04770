"""The local stack: one process per role plus an embedded Valkey, supervised by ``tessera serve``."""
