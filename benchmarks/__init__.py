"""Benchmarks: ``megatron-pc bench NAME`` runs one and prints (or writes) its figures. The
reports and the simulator they use live in ``megatron_pc.analysis``."""
