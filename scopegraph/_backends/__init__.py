"""Backends: host (numpy) and CUDA (cuda.core)."""
