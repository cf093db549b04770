"""Attention backends behind one interface: a PyTorch reference (CPU and GPU) and flashinfer
(CUDA only). Implemented by the engine issue."""
