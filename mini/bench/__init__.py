"""Mirrors the role of vLLM's benchmarks/ folder: `python -m mini bench <name>` micro-benchmarks.

Figures are ratios measured in one run and printed; tests never assert wall-clock limits.
`mini.bench.sampler.main(argv)`: the vectorized sampler against a per-row loop and a full sort.
"""

from __future__ import annotations
