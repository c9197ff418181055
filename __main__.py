"""deepseek-volc: DeepSeek serving on VolcEngine, one stack per environment."""

from infra import build_infra, export_outputs
from stacks import build_plan, from_pulumi_config, run_error
from workloads.serving import build_serving

with run_error():  # a settings mistake is one readable error, no traceback
    settings = from_pulumi_config()  # what the user wrote, validated
    plan = build_plan(settings)  # every derived decision, once
infra = build_infra(plan)
# The Kubernetes layer needs the cluster and the weights reader identity: phase 2 only
# (infra/identity.py; the `deploy_phase` output says what the next `pulumi up` does).
serving = build_serving(plan, infra) if infra.phase.workloads else None
if serving is not None and infra.edge is not None:
    # the edge's upstreams name the Services the Kubernetes layer just registered
    infra.edge.attach_routes(serving.services)
export_outputs(infra, serving)
