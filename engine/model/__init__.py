"""The model: its config, layers, attention backends and weight loading."""
