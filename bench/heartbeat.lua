-- wrk script for bench/heartbeat.py: rotates through the simulated nodes' tokens and bodies.
-- Arguments after `--`: the data file (one "token<TAB>body" line per node) and the path to POST to.
local requests = {}
local counter = 0
local threads_started = 0

function setup(thread)
  thread:set("thread_index", threads_started)
  threads_started = threads_started + 1
end

function init(args)
  local path = args[2]
  for line in io.lines(args[1]) do
    local token, body = line:match("^([^\t]+)\t(.*)$")
    requests[#requests + 1] = wrk.format("POST", path, {
      ["Authorization"] = "Bearer " .. token,
      ["Content-Type"] = "application/json",
    }, body)
  end
  -- Threads start at different nodes so that each node beats about as often as the others.
  counter = (thread_index * 7919) % #requests
end

function request()
  counter = counter % #requests + 1
  return requests[counter]
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d, ' ..
    '"p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
