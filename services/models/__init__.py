"""Model families behind one interface (family.py), one folder each, chosen in registry.py."""
