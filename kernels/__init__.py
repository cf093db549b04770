"""Attention backends behind one interface (``kernels.attention.AttentionBackend``):
a PyTorch reference that runs on CPU and GPU, and flashinfer, used only when CUDA is present."""
