"""``llmgw sim``: a fleet simulated through the real scheduler, reconciler and router.

Nothing runs: nodes are ``NodeView`` objects built from a recorded ``ctl nodes --json``
or a generated shape, agents are immediate state changes at times worked out from
sizes and rates, and a discrete-event clock moves from one event to the next.
docs/sim.md says how an operator uses it.
"""
