"""Measuring the engine: kernels (`perf`), offline throughput (`offline`) and a server under
load (`client`). Chapter 21 uses them for its ablation tables and plots."""
