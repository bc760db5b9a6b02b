"""Serving tether to agents: the MCP server (:mod:`.mcp`), admission control
(:mod:`.admission`) and bearer-token auth (:mod:`.auth`).

Kept import-free so the CLI and tests load only the part they use.
"""
