-- A heartbeat the beat script did not apply, written in one call: its time, and what else it
-- brought or had read from the database. livestate/heartbeats.py (`record`) calls this and
-- explains it; it builds KEYS and ARGV by name (RecordKeys, RecordArgs), in the order of the
-- assignments below (tests/test_beatscript.py holds the two to the same names).

local heartbeats_key = KEYS[1]     -- heartbeat times (hash)
local load_key = KEYS[2]           -- load
local load_lines_key = KEYS[3]     -- load's /metrics lines
local card_key = KEYS[4]           -- node card
local node_shards_key = KEYS[5]    -- node's cached shards
local self_metrics_key = KEYS[6]   -- the control plane's own counters (hash)

local node_id = ARGV[1]            -- node id
local received_at = ARGV[2]        -- arrival time
local load = ARGV[3]               -- load, or empty
local load_lines = ARGV[4]         -- load lines, or empty
local load_expiry = ARGV[5]        -- load expiry (s)
local card = ARGV[6]               -- node card, or empty
local card_expiry = ARGV[7]        -- card expiry (s)
local shards = ARGV[8]             -- node's shard list, or empty
local shards_expiry = ARGV[9]      -- shard list expiry (s)
local increments = ARGV[10]        -- how many self-metrics increments follow, each as three values

redis.call('HSET', heartbeats_key, node_id, received_at)
if load ~= '' then
  redis.call('SET', load_key, load, 'EX', load_expiry)
  redis.call('SET', load_lines_key, load_lines, 'EX', load_expiry)
end
if card ~= '' then
  redis.call('SET', card_key, card, 'EX', card_expiry)
end
if shards ~= '' then
  redis.call('SET', node_shards_key, shards, 'EX', shards_expiry)
end
-- Each increment is a kind ('int' for HINCRBY, 'float' for HINCRBYFLOAT), a field and an amount.
local first = 11
for n = 0, tonumber(increments) - 1 do
  local at = first + 3 * n
  if ARGV[at] == 'int' then
    redis.call('HINCRBY', self_metrics_key, ARGV[at + 1], ARGV[at + 2])
  else
    redis.call('HINCRBYFLOAT', self_metrics_key, ARGV[at + 1], ARGV[at + 2])
  end
end
return 1
