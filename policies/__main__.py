"""Entry point the Pulumi CLI runs for `pulumi preview --policy-pack policies`.

It only builds the PolicyPack, whose constructor serves the analyzer over gRPC. The policies
live in modules beside this file; the offline preview imports them without this file.
"""

import sys
from pathlib import Path

# The CLI runs this directory as a script (sys.path[0] is policies/); the capacity policy
# uses the project's planner (workloads/) and the pack's modules are the `policies` package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policies.pack import PACK_NAME, POLICIES, pack_description  # noqa: E402

PolicyPack(
    name=PACK_NAME,
    policies=POLICIES,
    enforcement_level=EnforcementLevel.MANDATORY,
    description=pack_description(),
)
