-- An agent's heartbeat, admitted and (when it is an ordinary one) applied in one round trip.
-- livestate/beatscript.py calls this and explains it. It builds KEYS and ARGV by name
-- (BeatKeys, BeatArgs), in the order of the assignments below; tests/test_beatscript.py
-- holds the two to the same names.

local refused_key = KEYS[1]        -- refused-token counter of the address
local rate_key = KEYS[2]           -- heartbeat counter of the token
local card_key = KEYS[3]           -- node card
local generation_key = KEYS[4]     -- node generation
local heartbeats_key = KEYS[5]     -- heartbeat times (hash)
local load_key = KEYS[6]           -- load
local load_lines_key = KEYS[7]     -- load's /metrics lines
local shard_versions_key = KEYS[8] -- shard versions (hash)
local node_shards_key = KEYS[9]    -- node's cached shards
local sequence_key = KEYS[10]      -- node's newest heartbeat: boot id, number (hash)
local cards_filled_key = KEYS[11]  -- set by every keeping of the cards; gone when Redis lost its data

local refused_allowed = ARGV[1]    -- refused tokens allowed
local heartbeats_allowed = ARGV[2] -- heartbeats allowed
local counter_expiry = ARGV[3]     -- counter expiry (s)
local secret_digest = ARGV[4]      -- SHA-256 of the secret
local node_id = ARGV[5]            -- node id
local received_at = ARGV[6]        -- arrival time
local mode = ARGV[7]               -- "apply" or "check"
local load = ARGV[8]               -- load, or empty
local load_lines = ARGV[9]         -- load lines, or empty
local load_expiry = ARGV[10]       -- load expiry (s)
local salt = ARGV[11]              -- a random salt
local boot_id = ARGV[12]           -- the agent run's boot id, or empty
local seq = ARGV[13]               -- the heartbeat's number in that run
local sequence_expiry = ARGV[14]   -- sequence expiry (s)

-- Counts one more on a fixed-minute counter, which expires with its minute; returns the count.
local function count(key)
  local n = redis.call('INCR', key)
  if n == 1 then
    redis.call('EXPIRE', key, counter_expiry)
  end
  return n
end

-- A refused credential counts against the address it came from; past the budget the
-- address hears 'locked' instead, for the rest of the minute. Only a wrong credential is
-- ever counted or locked: a right one is accepted whatever its address has sent, since
-- every agent behind a proxy shares that address with whoever else comes through it.
local function refuse()
  if count(refused_key) > tonumber(refused_allowed) then
    return {'locked'}
  end
  return {'unauthorized'}
end

-- Keyed by the digest of the whole token: a stranger's wrong secret counts on a key of its own.
if count(rate_key) > tonumber(heartbeats_allowed) then
  return {'rate'}
end

-- A missing or stale card: the caller proves the token from the database, then builds its
-- reply from the node's shard version and cached list read here, sparing it a round trip;
-- and, when no keeping has filled the cards since Redis lost its data, refills them.
local function stale(generation)
  local versions = redis.call('HMGET', shard_versions_key, node_id, '*')
  local node_shards = redis.call('GET', node_shards_key)
  return {'stale', generation, versions[1], versions[2], node_shards, redis.call('EXISTS', cards_filled_key)}
end

local raw = redis.call('GET', card_key)
local generation = tonumber(redis.call('GET', generation_key) or '0')
if not raw then
  return stale(generation)
end
local decoded, card = pcall(cmsgpack.unpack, raw)
-- A card is [node id, secret digest, liveness, admin state, inventory hash, generation].
if not decoded or type(card) ~= 'table' or card[6] ~= generation then
  return stale(generation)
end

-- The digests are compared through a hash salted afresh for every request, so how
-- long the comparison takes depends on neither of them: a guesser learns nothing of
-- how near it came. A revoked card's digest is empty.
local expected = card[2]
if type(expected) ~= 'string' or #expected == 0 then
  return refuse()
end
if redis.sha1hex(salt .. expected) ~= redis.sha1hex(salt .. secret_digest) then
  return refuse()
end

-- A heartbeat no newer than one already received from the same agent run changes
-- nothing; a new run starts its own sequence (livestate/sequence.py, same comparison).
if boot_id ~= '' then
  local last = redis.call('HMGET', sequence_key, 'boot', 'seq')
  if last[1] == boot_id and tonumber(seq) <= tonumber(last[2]) then
    return {'replayed', last[2]}
  end
  redis.call('HSET', sequence_key, 'boot', boot_id, 'seq', seq)
  redis.call('EXPIRE', sequence_key, sequence_expiry)
end

-- A new inventory is the database's business. A node coming back to life is not:
-- its time is noted like any other, and the sweep's flush revives it in bulk.
if mode ~= 'apply' then
  return {'card', raw}
end
redis.call('HSET', heartbeats_key, node_id, received_at)
if load ~= '' then
  redis.call('SET', load_key, load, 'EX', load_expiry)
  redis.call('SET', load_lines_key, load_lines, 'EX', load_expiry)
end
-- '*' is the field of every node's counter (livestate.shardversion.EVERY_NODE).
local versions = redis.call('HMGET', shard_versions_key, node_id, '*')
return {'applied', raw, versions[1], versions[2], redis.call('GET', node_shards_key)}
