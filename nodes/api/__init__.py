"""The agent API: registration with a join token, heartbeats with a node token.

`views` only authenticate, validate and hand over; `registration` and
`heartbeats` own the changes; `cards` keeps what the heartbeat path needs to
know of a node in Redis, so that an ordinary heartbeat reads no database.
"""
