"""`dsvolc`, the command line: `preview` (the real program under Pulumi's mock engine plus
the real policy pack through pulumi_policy's analyzer), `new` (a stack from another), `size`
(the capacity planner), `images`, `manifests`; `stackfiles` lists the stacks for the
workflows (it needs PyYAML only).

May import: every other package of the project; nothing imports it.
"""
