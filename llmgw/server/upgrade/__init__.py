"""``llmgw ctl upgrade``: the stored run, its service and the leader\x27s keeper."""
