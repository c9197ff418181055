"""deepseek-volc: DeepSeek serving on VolcEngine, one stack per environment."""

from infra import build_infra, export_outputs
from stacks import from_pulumi_config

settings = from_pulumi_config()
infra = build_infra(settings)
export_outputs(infra)
