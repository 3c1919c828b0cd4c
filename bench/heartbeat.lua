-- wrk script for bench/heartbeat.py: rotates through the simulated nodes' tokens and bodies.
-- Arguments after `--`: the data file (one "token<TAB>body" line per node), the path to POST to,
-- where in its share of the nodes each thread starts (so that runs continue one another), and
-- the number of threads.
-- Thread i of n sends the nodes i, i+n, i+2n, …: every node is sent, each by one thread only.
local requests = {}
local counter = 0
local threads_set_up = 0

function setup(thread)
  thread:set("thread_index", threads_set_up)
  threads_set_up = threads_set_up + 1
end

function init(args)
  local path, start, threads = args[2], tonumber(args[3]), tonumber(args[4])
  local index = 0
  for line in io.lines(args[1]) do
    if index % threads == thread_index then
      local token, body = line:match("^([^\t]+)\t(.*)$")
      requests[#requests + 1] = wrk.format("POST", path, {
        ["Authorization"] = "Bearer " .. token,
        ["Content-Type"] = "application/json",
      }, body)
    end
    index = index + 1
  end
  counter = start % #requests
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
