"""The newest heartbeat received from each node's agent run, so that an older one changes nothing.

An agent numbers its heartbeats from 1 within each run and names the run with
a boot id drawn at random when it starts (agent/loop.py). A heartbeat of the
same run with a number no greater than the stored one is old: delayed, retried
by a proxy, or replayed. It is refused before it writes anything. A new boot
id starts its own sequence; an empty one (an agent older than these fields)
claims no order and is neither checked nor recorded.

The beat script checks and records this in the round trip that admits a
heartbeat whose card is cached (livestate/beatscript.lua, the same comparison
as `_ADVANCE` below). A heartbeat whose card had to be read from the database
is checked here, once its token has been: only a proven token may move a
node's sequence. The database keeps the sequence of the stored inventory too
(inventory/registration.py), for while Redis is down.
"""

from __future__ import annotations

from livestate import keys
from livestate.ownscript import OwnScript

# A delayed copy of a heartbeat is not held anywhere for longer than this; a node
# deleted, or silent that long, leaves no key behind.
KEEP_SECONDS = 86_400

_ADVANCE = """
local last = redis.call('HMGET', KEYS[1], 'boot', 'seq')
if last[1] == ARGV[1] and tonumber(ARGV[2]) <= tonumber(last[2]) then
  return last[2]
end
redis.call('HSET', KEYS[1], 'boot', ARGV[1], 'seq', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return false
"""
# This runs for every heartbeat whose card was not cached, a whole fleet's after Redis lost its
# data: sent on the heartbeat's cheap route (by digest, packed by hiredis).
_advance = OwnScript(_ADVANCE)


def advance(node_id: str, boot_id: str, seq: int) -> int | None:
    """Record (boot_id, seq) as the node's newest heartbeat; the stored number instead if this one is no newer.

    Raises redis errors.
    """
    if not boot_id:
        return None
    stored = _advance([keys.sequence(node_id)], [boot_id, seq, KEEP_SECONDS])
    return None if stored is None else int(stored)
