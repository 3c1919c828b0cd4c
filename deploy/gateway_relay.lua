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
        if not REQUEST_SKIP[name] and string.sub(name, 1, 8) ~= "x-llmgw-" then
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
local function pass(applet, count, piece)
    if count then
        COUNT.piece(count, piece)
    end
    applet:send(piece)
end

-- The answer's body after its headers: true when it was read to its end; false when cut, with
-- the last piece sent (an error event starts after a blank line).
local function relay_body(applet, upstream, count, chunked, length)
    local last = ""
    if chunked then
        while true do
            local size_line = upstream:receive("*l")
            local hex = size_line and string.match(size_line, "^%x+")
            local size = hex and tonumber(hex, 16)
            if size == nil then
                return false, last
            end
            if size == 0 then
                -- The trailers, if any, end with an empty line; the answer is whole.
                repeat
                    local trailer = upstream:receive("*l")
                until trailer == nil or trailer == ""
                return true
            end
            -- The chunk and the CRLF after it, in one read (a read costs more than the copy).
            local data, _, partial = upstream:receive(size + 2)
            if data == nil then
                -- What came of a cut chunk is sent: the client sees all the engine sent.
                if partial ~= nil and partial ~= "" then
                    last = string.sub(partial, 1, size)
                    pass(applet, count, last)
                end
                return false, last
            end
            last = string.sub(data, 1, size)
            pass(applet, count, last)
        end
    elseif length ~= nil then
        if length > 0 then
            local data, _, partial = upstream:receive(length)
            pass(applet, count, data or partial or "")
            return data ~= nil
        end
        return true
    else
        -- No length, not chunked: the answer ends with the connection, so it cannot be told cut.
        local data, _, partial = upstream:receive("*a")
        pass(applet, count, data or partial or "")
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
        local name, value = string.match(line, "^([^:]+):%s*(.-)%s*$")
        if name ~= nil then
            name = string.lower(name)
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
    local whole, last = relay_body(applet, upstream, count, chunked, not chunked and length or nil)
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
        applet:send(CUT)
    end
end

core.register_service("llmgw_relay", "http", relay)
