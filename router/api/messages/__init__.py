"""Anthropic's Messages API (POST /v1/messages) over the Chat Completions pipeline."""
