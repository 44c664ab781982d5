"""``llmgw console``: the full-screen Textual UI, a client of the admin API only."""
