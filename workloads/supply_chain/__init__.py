"""Supply chain: every chart and image the stack deploys, its mirror in the stack's registry,
and the pinned versions.
"""
