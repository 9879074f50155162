"""Coding agents as callers: the context they read first, and the MCP server."""
