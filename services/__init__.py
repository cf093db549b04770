"""Tessera's services: preprocess, encoder, prefill, decode, gateway, and the ``tessera`` CLI."""
