"""The OpenAI-facing side of the router: request models, prompts, tools and structured
outputs, response objects, streaming, the OpenAPI document and /tokenize."""
