"""`dsvolc`, the command line: `preview` (the real program under Pulumi's mock engine plus
the real policy pack through pulumi_policy's analyzer) and `size` (the capacity planner).

May import: every other package of the project; nothing imports it.
"""
