"""The serving engine: the context every renderer reads, vLLM arguments, the Deployment or
LeaderWorkerSet, RDMA, the Triton front, autoscaling, canary rollout and node resilience.
"""
