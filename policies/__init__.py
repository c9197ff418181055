"""The deepseek-volc CrossGuard policy pack.

`pulumi preview --policy-pack policies` runs `policies/__main__.py`, which serves the
policies below; `dsvolc preview` runs the same policies offline through pulumi_policy's
analyzer servicer (dsvolc/policy_runner.py). The policies live in modules by concern and
are gathered in `policies.pack.POLICIES`.

May import: `stacks` (constants, regions), `capacity` (the engine-fits check) and
pulumi_policy. Never `infra` or `workloads`: a policy judges what was registered, not how.
"""
