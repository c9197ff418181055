"""The capacity planner and its catalog: will a model fit these GPUs under vLLM, and how?

Pure Python, no I/O beyond reading a local config.json: `specs` (the records), `params`
(parameters per tensor as vLLM shards them), `catalog` (models and GPUs, each with its
source), `instances` (VolcEngine GPU instance types), `planner` (`plan()`), `suggest` (the
known name closest to a typo), `docs` (the generated table in docs/planner.md).

May import: the standard library only. Used by `stacks` (settings are sized by the planner),
`workloads` (renderers read the plan) and `dsvolc` (`dsvolc size`).
"""
