-- An agent's heartbeat, admitted and (when it is an ordinary one) applied in one round trip.
-- nodes/api/beatscript.py calls this and explains it; the key and argument order is its.
--
-- KEYS: 1 refused-token counter of the address, 2 heartbeat counter of the token,
--       3 node card, 4 node generation, 5 heartbeat times (hash), 6 load, 7 load's /metrics lines,
--       8 shard versions (hash), 9 node's cached shards
-- ARGV: 1 refused tokens allowed, 2 heartbeats allowed, 3 counter expiry (s), 4 SHA-256 of the secret,
--       5 node id, 6 arrival time, 7 "apply" or "check", 8 load, 9 load lines, 10 load expiry (s),
--       11 a random salt

local refused = tonumber(redis.call('GET', KEYS[1]) or '0')
if refused >= tonumber(ARGV[1]) then
  return {'locked'}
end
local hits = redis.call('INCR', KEYS[2])
if hits == 1 then
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
if hits > tonumber(ARGV[2]) then
  return {'rate'}
end

local raw = redis.call('GET', KEYS[3])
local generation = tonumber(redis.call('GET', KEYS[4]) or '0')
if not raw then
  return {'stale', generation}
end
local decoded, card = pcall(cmsgpack.unpack, raw)
-- A card is [node id, secret digest, liveness, admin state, inventory hash, generation].
if not decoded or type(card) ~= 'table' or card[6] ~= generation then
  return {'stale', generation}
end

-- The digests are compared through a hash salted afresh for every request, so how
-- long the comparison takes depends on neither of them: a guesser learns nothing of
-- how near it came. A revoked card's digest is empty.
local expected, given, salt = card[2], ARGV[4], ARGV[11]
if type(expected) ~= 'string' or #expected == 0 then
  return {'unauthorized'}
end
if redis.sha1hex(salt .. expected) ~= redis.sha1hex(salt .. given) then
  return {'unauthorized'}
end

-- A node coming back to life, or a new inventory, is the database's business.
if ARGV[7] ~= 'apply' or card[3] ~= 'alive' then
  return {'card', raw}
end
redis.call('HSET', KEYS[5], ARGV[5], ARGV[6])
if ARGV[8] ~= '' then
  redis.call('SET', KEYS[6], ARGV[8], 'EX', ARGV[10])
  redis.call('SET', KEYS[7], ARGV[9], 'EX', ARGV[10])
end
local versions = redis.call('HMGET', KEYS[8], ARGV[5], '*')
return {'applied', raw, versions[1], versions[2], redis.call('GET', KEYS[9])}
