"""Benchmarks of what users pay for: submission, checkpoint stall, preemption to safe, resume,
DDP overhead, status polling and LangSplat throughput.

    python -m bench [--only NAME ...] [--quick]     # writes BENCHMARKS.md at the repository root

One module per measurement; each returns a bench.report.Section holding its figure and the
comparison measured in the same run, so a noisy shared machine affects both alike.
"""
