-- The gateway's stream relay: a streamed request goes through it, so that a stream its engine
-- cuts mid-way (the engine killed, its machine gone) ends with an SSE error event the client can
-- read, and a complete response, instead of a truncated one (docs/gateway.md, "Failover").
--
-- HAProxy cannot add to a response whose server aborted, so the stream's answer is read here:
-- the public frontend hands a streamed request, once its key, limits and model are checked, to
-- this service (`http-request use-service lua.llmgw_relay`), which sends it over a cosocket to
-- the gateway's internal frontend (`frontend relay`, a unix socket in its private directory),
-- which routes it to the backend chosen here (retries, weights, prefix affinity, drains, the
-- usage filter and the exporter's series all happen on that hop, as for any other request).
-- The answer's chunks are relayed as they come; an answer that ends before its chunked end gets
-- the error event, then ends cleanly.
--
-- On the way, the request asks its engine for a running usage (with_running_usage), and an event stream's
-- pieces are handed to its count as they pass (deploy/gateway_usage.lua's llmgw_relay_count: the usage
-- filter leaves the streams of the relay's frontend to it).
--
-- A relay that falls a whole buffer behind its hop (its client reading more slowly than the engine writes)
-- cannot catch up in HAProxy 2.6; a watchdog (below) ends its stream with an error event instead of a hang.
--
-- Loaded by deploy/gateway.cfg (`lua-load`), which sets LLMGW_RELAY_SOCKET (`setenv`) first, and loads the
-- usage filter before it.

local SOCKET = "unix@" .. assert(os.getenv("LLMGW_RELAY_SOCKET"), "LLMGW_RELAY_SOCKET is not set")
-- The usage filter's count of relayed streams; nil where the filter is not loaded (bench.tenants' sides
-- without it), and then nothing is counted.
local COUNT = llmgw_relay_count
-- The server the internal frontend's backend chose, which it names in the answer for the count.
local SERVER_HEADER = "x-llmgw-server"
-- As `timeout server`: a long generation may pause this long before its first token.
local TIMEOUT = 600

-- Each relay in flight, by its socket to the internal frontend, for the watchdog (below): where it is
-- (`at`: SENDING to its client, RECEIVING from its hop, nil between), the pieces it has sent (`n`), whether
-- the watchdog has seen it blocked on its client (`lagged`) and has probed it (`probed`). Weak keys: a relay
-- whose client left is dropped with its coroutine, socket and all.
local RELAYS = setmetatable({}, { __mode = "k" })
local SENDING, RECEIVING = 1, 2
-- Milliseconds between the watchdog's rounds. A relay is seen blocked on its client if it is for a round; to
-- fall a buffer behind unseen, it would have to take in half a megabyte (the kernel's queues and two buffers)
-- in less, far more than an engine writes. A round over 10,000 relays takes under a millisecond.
local WATCH_EVERY_MS = 250
-- An empty line before a request line, which an HTTP/1.1 server ignores (RFC 9112, section 2.2): the internal
-- frontend reads it and carries on; a hop that has ended refuses it, and the relay's wait ends.
local PROBE = "\r\n"

-- Not sent on: hop-by-hop headers, the length (the body is sent whole, with its own), and the
-- internal routing headers, which only the relay sets (the internal frontend trusts them).
local REQUEST_SKIP = {
    ["connection"] = true,
    ["keep-alive"] = true,
    ["proxy-connection"] = true,
    ["te"] = true,
    ["trailer"] = true,
    ["transfer-encoding"] = true,
    ["upgrade"] = true,
    ["content-length"] = true,
    ["expect"] = true,
}
local RESPONSE_SKIP = {
    ["connection"] = true,
    ["keep-alive"] = true,
    ["transfer-encoding"] = true,
    ["trailer"] = true,
    [SERVER_HEADER] = true,
}

local CUT = 'data: {"error": {"message": "The model\'s engine stopped before the end of the answer",'
    .. ' "type": "server_error", "param": null, "code": "upstream_disconnected"}}\n\n'
-- A stream the watchdog ended (below): its client read more slowly than its engine wrote, fell a whole buffer
-- behind, and the rest of the answer could not be relayed.
local STALLED = 'data: {"error": {"message": "The gateway could not relay the rest of the answer: the client'
    .. ' read it more slowly than the engine wrote it and fell too far behind", "type": "server_error",'
    .. ' "param": null, "code": "relay_stalled"}}\n\n'

local function reply(applet, status, code, message)
    local body = '{"error":{"message":"' .. message .. '","type":"server_error","param":null,"code":"' .. code .. '"}}'
    applet:set_status(status)
    applet:add_header("content-type", "application/json")
    applet:add_header("content-length", tostring(#body))
    applet:start_response()
    applet:send(body)
end

local function request_text(applet, body, tenant, model)
    local target = applet.path
    if applet.qs ~= nil and applet.qs ~= "" then
        target = target .. "?" .. applet.qs
    end
    local parts = { applet.method, " ", target, " HTTP/1.1\r\n" }
    local n = #parts
    for name, values in pairs(applet.headers) do
        if not REQUEST_SKIP[name] and string.find(name, "x-llmgw-", 1, true) ~= 1 then
            for i = 0, #values do
                n = n + 1
                parts[n] = name .. ": " .. values[i] .. "\r\n"
            end
        end
    end
    n = n + 1
    parts[n] = "x-llmgw-backend: " .. (applet:get_var("txn.backend") or "") .. "\r\n"
        .. "x-llmgw-tenant: " .. (tenant or "") .. "\r\n"
        .. "x-llmgw-model: " .. (model or "") .. "\r\n"
        .. "content-length: " .. #body .. "\r\nconnection: close\r\n\r\n"
    parts[n + 1] = body
    return table.concat(parts)
end

-- A piece of the answer on to the client, kept first for the count of an event stream's tokens (`count`,
-- nil for an answer that is not one).
local function pass(applet, state, count, piece)
    if count then
        COUNT.piece(count, piece)
    end
    state.at = SENDING
    applet:send(piece)
    state.at = nil
    state.n = state.n + 1
end

-- upstream:receive(pattern), with the relay marked waiting on its hop meanwhile.
local function take(state, upstream, pattern)
    state.at = RECEIVING
    local data, err, partial = upstream:receive(pattern)
    state.at = nil
    return data, err, partial
end

-- The answer's body after its headers: true when it was read to its end; false when cut, with
-- the last piece sent (an error event starts after a blank line).
local function relay_body(applet, upstream, state, count, chunked, length)
    local last = ""
    if chunked then
        while true do
            local size_line = take(state, upstream, "*l")
            local hex = size_line and string.match(size_line, "^%x+")
            local size = hex and tonumber(hex, 16)
            if size == nil then
                return false, last
            end
            if size == 0 then
                -- The trailers, if any, end with an empty line; the answer is whole.
                repeat
                    local trailer = take(state, upstream, "*l")
                until trailer == nil or trailer == ""
                return true
            end
            -- The chunk and the CRLF after it, in one read (a read costs more than the copy).
            local data, _, partial = take(state, upstream, size + 2)
            if data == nil then
                -- What came of a cut chunk is sent: the client sees all the engine sent.
                if partial ~= nil and partial ~= "" then
                    last = string.sub(partial, 1, size)
                    pass(applet, state, count, last)
                end
                return false, last
            end
            last = string.sub(data, 1, size)
            pass(applet, state, count, last)
        end
    elseif length ~= nil then
        if length > 0 then
            local data, _, partial = take(state, upstream, length)
            pass(applet, state, count, data or partial or "")
            return data ~= nil
        end
        return true
    else
        -- No length, not chunked: the answer ends with the connection, so it cannot be told cut.
        local data, _, partial = take(state, upstream, "*a")
        pass(applet, state, count, data or partial or "")
        return true
    end
end

-- `body` with `members` (",name:value…", from running_usage.map: what the backend's engine kind needs
-- to put a running usage on every event) before its closing brace, after the client's own members, so
-- they win where both name one: the stream is counted as it passes, up to where a client that leaves
-- left. A body that does not end its object there is sent as it came, for the engine to refuse.
local function with_running_usage(body, members)
    if members == nil or members == "" then
        return body
    end
    local last = #body
    while last > 0 and string.find(" \t\r\n", string.sub(body, last, last), 1, true) do
        last = last - 1
    end
    if last == 0 or string.byte(body, last) ~= 125 then -- "}"
        return body
    end
    return string.sub(body, 1, last - 1) .. members .. string.sub(body, last)
end

local function relay(applet)
    local arrived = core.now()
    local tenant, model = applet:get_var("txn.tenant"), applet:get_var("txn.model")
    local body = with_running_usage(applet:receive() or "", applet:get_var("txn.running_usage"))
    local upstream = core.tcp()
    upstream:settimeout(TIMEOUT)
    if not upstream:connect(SOCKET) then
        return reply(applet, 503, "relay_unavailable", "The gateway could not reach its relay; retry later")
    end
    if upstream:send(request_text(applet, body, tenant, model)) == nil then
        upstream:close()
        return reply(applet, 503, "relay_unavailable", "The gateway could not reach its relay; retry later")
    end
    local status_line = upstream:receive("*l")
    local status, reason = string.match(status_line or "", "^HTTP/1%.%d (%d%d%d) ?(.*)$")
    if status == nil then
        upstream:close()
        return reply(applet, 502, "upstream_disconnected", "The model's engine gave no answer")
    end
    applet:set_status(tonumber(status), reason)
    local chunked, length, event_stream, server = false, nil, false, nil
    while true do
        local line = upstream:receive("*l")
        if line == nil then
            upstream:close()
            return reply(applet, 502, "upstream_disconnected", "The model's engine gave no answer")
        end
        if line == "" then
            break
        end
        -- Read by position, not by a pattern: HAProxy's internal frontend writes each header as `name: value`,
        -- the name in lower case and the value trimmed (the gateway sets no h1-case-adjust), and a pattern and a
        -- lowered copy a header cost a relayed stream 27,000 instructions (docs/benchmarks-gateway.md).
        local colon = string.find(line, ":", 1, true)
        if colon ~= nil then
            local name = string.sub(line, 1, colon - 1)
            local value = string.sub(line, colon + (string.byte(line, colon + 1) == 32 and 2 or 1))
            if name == "transfer-encoding" then
                chunked = string.find(string.lower(value), "chunked", 1, true) ~= nil
            elseif name == "content-length" then
                length = tonumber(value)
            elseif name == "content-type" then
                event_stream = string.find(string.lower(value), "text/event-stream", 1, true) ~= nil
            elseif name == SERVER_HEADER then
                server = value
            end
            if not RESPONSE_SKIP[name] and not (chunked and name == "content-length") then
                applet:add_header(name, value)
            end
        end
    end
    applet:start_response()
    local count = nil
    if event_stream and COUNT then
        count = COUNT.start(tenant or "-", model or "-", (server ~= nil and server ~= "") and server or "-", arrived)
    end
    local state = { n = 0 }
    RELAYS[upstream] = state
    local whole, last = relay_body(applet, upstream, state, count, chunked, not chunked and length or nil)
    RELAYS[upstream] = nil
    upstream:close()
    if count then
        COUNT.finish(count)
    end
    if not whole then
        if not event_stream then
            -- Not an event stream: nothing the client could read as an error; the answer is aborted.
            error("the upstream answer was cut")
        end
        if last ~= nil and last ~= "" and string.sub(last, -2) ~= "\n\n" then
            applet:send("\n\n")
        end
        if state.probed then
            -- In HAProxy's log (the gateway's output): an operator seeing relay_stalled errors finds them here.
            core.Warning(string.format("llmgw relay: ended a stream its client had fallen a buffer behind"
                .. " (tenant %s, model %s, server %s, %d pieces relayed)", tenant or "-", model or "-",
                server or "-", state.n))
        end
        applet:send(state.probed and STALLED or CUT)
    end
end

core.register_service("llmgw_relay", "http", relay)

-- The watchdog. HAProxy 2.6's cosocket does not tell its connection when the relay has read room into a
-- full buffer (the relay's receive consumes outside the socket's own handler, whose check for consumed data
-- is all that clears the connection's wait for room): once a relay falls a whole buffer behind its hop,
-- because its client reads more slowly than the engine writes, the rest of the answer is never read, and
-- the relay would wait for it forever. Such a hop, not read, ends its side after `timeout client` (the
-- internal frontend's, in deploy/gateway.cfg), but that too goes unseen. So each round the watchdog notes
-- the relays it finds blocked on their clients, and probes those of them that wait on their hop with
-- nothing relayed since the round before: a hop still there reads the probe and carries on, one that has
-- ended refuses it, the socket fails, and the relay ends its stream with an error event (STALLED).
local function watch()
    while true do
        core.msleep(WATCH_EVERY_MS)
        -- Found first, probed after: a probe may yield, and relays starting meanwhile add to the table.
        local waiting = {}
        for upstream, state in pairs(RELAYS) do
            if state.at == SENDING then
                state.lagged = true
            elseif state.at == RECEIVING and state.lagged and state.n == state.seen then
                waiting[#waiting + 1] = upstream
            end
            state.seen = state.n
        end
        for _, upstream in ipairs(waiting) do
            local state = RELAYS[upstream]
            if state ~= nil then
                state.probed = true
                pcall(upstream.send, upstream, PROBE)
            end
        end
    end
end

core.register_task(watch)
