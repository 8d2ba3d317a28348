"""The engine thread: the loop that owns an engine, its commands and request streams."""
