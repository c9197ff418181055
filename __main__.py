"""deepseek-volc: DeepSeek serving on VolcEngine, one stack per environment."""

from infra import build_infra, export_outputs
from stacks import from_pulumi_config
from workloads.serving import build_serving

settings = from_pulumi_config()
infra = build_infra(settings)
serving = build_serving(settings, infra)
export_outputs(infra, serving)
