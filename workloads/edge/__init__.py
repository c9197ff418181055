"""The in-cluster edge: Envoy Gateway (JWT, rate limits, the canary split) and the network
policy that admits each hop.
"""
