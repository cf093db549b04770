"""Code shared by every Tessera service: typed ids, the hashing contract, built-in models."""
