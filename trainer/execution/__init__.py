"""How the maths runs: plans (eager, CUDA graphs, streams, fused), Triton kernels, the data sources
the trainer learns from and on-device collection."""
