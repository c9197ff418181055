"""deepseek-volc: DeepSeek serving on VolcEngine, one stack per environment."""

from infra import build_infra, export_outputs
from stacks import from_pulumi_config
from workloads.serving import build_serving

settings = from_pulumi_config()
infra = build_infra(settings)
# The Kubernetes layer needs the cluster and the weights reader identity: phase 2 only
# (infra/identity.py; the `deploy_phase` output says what the next `pulumi up` does).
serving = build_serving(settings, infra) if infra.phase.workloads else None
export_outputs(infra, serving)
