"""Built-in offline models and resolution of model references (``tiny``, ``small`` or a path)."""
