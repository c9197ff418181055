"""The capacity planner and its catalog: will a model fit these GPUs under vLLM, and how fast?

Pure Python, no I/O beyond reading a local config.json and the package's own cited data
files: `specs` (the records), `params` (parameters per tensor as vLLM shards them),
`catalog` (models and GPUs, each with its source), `instances` (VolcEngine GPU instance
types), `planner` (`plan()`: memory), `memory` (the byte counts it plans with), `suggest` (closest-name suggestions for mistyped
names), `perf` (the performance model, with `hardware.yaml`), `calibration` (the model
against published figures, `calibration.yaml`), `sizing` (replicas, nodes and cost for a
load, `pricing.yaml`), `docs` (the generated table in docs/planner.md).

May import: the standard library and PyYAML (the data files). Used by `stacks` (settings
are sized by the planner), `workloads` (renderers read the plan) and `dsvolc` (`dsvolc size`).
"""
