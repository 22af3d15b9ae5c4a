"""Talking to chat-completions models: the client the engine calls, and the scripted model.

Nothing is imported here so that importing a submodule stays cheap; use
`heddle.model.client` (ModelClient, ModelEndpoint, AssistantTurn) and
`heddle.model.scripted` (load_script, serve).
"""
