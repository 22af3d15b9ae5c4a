"""Sessions: a conversation, the checkpoint of an unfinished run and what it waits for, kept in a
store (heddle.sessions.store) across runs and processes. docs/sessions.md is the user's account."""
