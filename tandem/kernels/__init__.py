"""Our own compiled kernels: fused float32 CPU kernels for the decode step (cpu.py)."""
