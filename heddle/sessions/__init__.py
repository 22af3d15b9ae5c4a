"""Sessions: a conversation, the checkpoint of an unfinished run and what it waits for, kept in a
store (heddle.sessions.store) across runs and processes. docs/sessions.md is the user's account."""

# How long an owner's lease lasts unless it is renewed (heddle.sessions.lease): the longest a run of a
# process that died waits before another takes it over. Renewed every third of it, so a pause of the
# owner (a full disk, a stalled store) of up to two thirds of it costs nothing. Written here, where the
# flag table reads it (`--session-lease`) without loading the leases' own imports before `--help`.
LEASE_SECONDS = 30.0
