"""The MCP gateway: tool servers kept in the store, their tools granted per key and
served on the gateway's ``/mcp``, and ``llmgw:admin``, answered in-process."""
