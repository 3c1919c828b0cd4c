-- The gateway's counter, in every answer's path: prompt and completion tokens per tenant, model and
-- server, as the engines report them in `usage` (the JSON body of an answer, or a stream's events: its
-- last before [DONE], which engines send when the request asks `stream_options: {"include_usage": true}`,
-- or a running one on every event, with vLLM's continuous usage stats) or, in llama-server's streams,
-- which it ends with them whatever was asked (and puts on every event with `timings_per_token`), in
-- `timings`; and each stream's time to first token as its client sees it, per model and server.
--
-- A stream is counted as it passes: each usage it reports adds what it counts more than the one before,
-- so a stream whose client goes away keeps the tokens its last running usage counted. The streams that
-- go through the stream relay (deploy/gateway_relay.lua: every stream, unless the config is rendered
-- without it, as a benchmark does) are read from the pieces the relay hands here, a few at a time
-- (llmgw_relay_count, at the end); this filter reads the others, and every whole answer.
--
-- Loaded by deploy/gateway.cfg (`lua-load`, one thread: Debian's 2.6 Lua filter crashed with two).
-- Totals stay in this process until the sync takes them with `llmgw usage take` on the admin
-- socket, which answers them and starts again from zero, so each token is handed over once.
--
-- What a request costs here is mostly HAProxy's, not this file's: each callback builds a `txn`
-- object of a dozen tables, and a filter has at least three callbacks per request (`new`, then
-- `http_headers` on each message: 2.6 calls it for both when it is defined, as it does
-- `start_analyze`, and only such a callback can register for the answer's data), plus, when the
-- answer is not whole with its headers, one `http_payload` per piece until its end is seen (a whole
-- answer's usage; a stream's [DONE]). Measured with callgrind (docs/gateway.md, "What it costs"); what
-- is left to this file is kept to plain string searches and no work on a request's way in.

local find, match, sub, byte, concat = string.find, string.match, string.sub, string.byte, table.concat
local now = core.now

-- Per "tenant model server": { requests, prompt tokens, completion tokens }.
local totals = {}

-- Time to first token: from the request's arrival (its stream's creation, when its first bytes came)
-- to the first bytes of a streamed answer's body (Content-Type text/event-stream), in microseconds,
-- counted in these buckets (upper bounds: vLLM's time-to-first-token buckets, so both read alike).
-- gateway/counted.py holds the same bounds, in seconds; keep the two equal.
local BOUNDS_US = {
    1000, 5000, 10000, 20000, 40000, 60000, 80000, 100000, 250000, 500000, 750000, 1000000,
    2500000, 5000000, 7500000, 10000000, 20000000, 40000000, 80000000, 160000000, 640000000, 2560000000,
}
local BUCKETS = #BOUNDS_US + 1 -- the last one: over every bound (+Inf)
-- Per "model server": { sum of microseconds, then the count in each bucket (not cumulative) }.
local first_tokens = {}

-- A usage object cut between two pieces of an answer is kept (from its "usage" on) at most this long.
local TAIL = 1024
-- A stream's "data: [DONE]" and the blank line that ends it, with room for CRLFs.
local DONE_AT_END = 20
-- The stream relay's internal frontend (deploy/gateway.cfg): an event stream there is counted by the
-- relay (llmgw_relay_count, below), not by this filter.
local RELAY_FRONTEND = "relay"

-- The counts of the last `key` object in `text` that `counts` reads (prompt, completion), or nil; and
-- where such an object begins that the text cuts short (the next piece completes it), or nil. Plain
-- searches first: most pieces of a stream hold neither key, and each found is checked at its place only.
-- Objects are read where they lie, by position, not copied out: a running usage is on every event, and
-- each string made is garbage to collect. Only the last whole object's numbers are read (`every`: each
-- one's), as reading them costs twice what finding the object does and a piece may hold many events, each
-- with a running usage; where the last has none, the walk is made again with `every`.
local function counted_in(text, key, counts, every)
    local after = #key
    local prompt, completion, last, last_close, cut
    local at = find(text, key, 1, true)
    while at do
        local value = match(text, "^%s*:%s*()", at + after)
        if value == nil then
            if find(text, "^%s*:?%s*$", at + after) then
                cut = at
                break
            end
            at = find(text, key, at + after, true) -- the key's word as a string, not a key
        elseif value > #text then
            cut = at
            break
        elseif byte(text, value) ~= 123 then -- not an object ("usage": null in every chunk of some engines)
            at = find(text, key, value, true)
        else
            local close = match(text, "^%b{}()", value)
            if close == nil then
                cut = at
                break
            end
            if every then
                local p, c = counts(text, value, close)
                if p then
                    prompt, completion = p, c
                end
            else
                last, last_close = value, close
            end
            at = find(text, key, close, true)
        end
    end
    if last then
        prompt, completion = counts(text, last, last_close)
        if prompt == nil then
            return counted_in(text, key, counts, true)
        end
    end
    return prompt, completion, cut
end

-- The number after `pattern`'s key within text[from, to), or nil.
local function number_in(text, pattern, from, to)
    local at, _, digits = find(text, pattern, from)
    if at and at < to then
        return tonumber(digits)
    end
end

local function usage_counts(text, from, to)
    local p = number_in(text, '"prompt_tokens"%s*:%s*(%d+)', from, to)
    local c = p and number_in(text, '"completion_tokens"%s*:%s*(%d+)', from, to)
    if c then
        return p, c
    end
end

-- llama-server ends every stream with `timings`, asked for usage or not: the prompt's tokens taken from
-- its cache (cache_n) and read (prompt_n), and those it predicted, which its `usage` gives when asked.
local function timings_counts(text, from, to)
    local cached = number_in(text, '"cache_n"%s*:%s*(%d+)', from, to)
    local p = cached and number_in(text, '"prompt_n"%s*:%s*(%d+)', from, to)
    local c = p and number_in(text, '"predicted_n"%s*:%s*(%d+)', from, to)
    if c then
        return cached + p, c
    end
end

-- A piece's counts: its last `usage` (where both appear, as in an asked llama-server stream's last event,
-- they agree), else llama-server's `timings`; and where a cut one begins.
local function usage_in(text)
    local prompt, completion, cut = counted_in(text, '"usage"', usage_counts)
    if prompt or cut then
        return prompt, completion, cut
    end
    return counted_in(text, '"timings"', timings_counts)
end

local Usage = {}
Usage.id = "llmgw usage"
Usage.flags = filter.FLT_CFG_FL_HTX
Usage.__index = Usage

-- Called as the request's stream is made, on its first bytes (a kept-alive connection's wait for its
-- next request is not in it): that is the request's arrival.
function Usage:new()
    return setmetatable({ arrived = now() }, Usage)
end

-- "model server" of the answer, looked up once.
local function where(self, txn)
    local key = self.where
    if key == nil then
        key = (txn:get_var("txn.model") or "-") .. " " .. (txn.f:srv_name() or "-")
        self.where = key
    end
    return key
end

local function first_token(self, txn, arrived)
    local at = now()
    local us = (at.sec - arrived.sec) * 1000000 + (at.usec - arrived.usec)
    local i = 1
    while i < BUCKETS and us > BOUNDS_US[i] do
        i = i + 1
    end
    local key = where(self, txn)
    local counts = first_tokens[key]
    if counts == nil then
        counts = { 0 }
        for b = 2, BUCKETS + 1 do
            counts[b] = 0
        end
        first_tokens[key] = counts
    end
    counts[1] = counts[1] + us
    counts[i + 1] = counts[i + 1] + 1
end

-- A usage seen. A whole answer has one, counted as it is. In a stream the request is counted at its first,
-- and each later one (a running usage, or its last) adds only what it counts beyond the one before, so a
-- usage read twice (a piece kept for a cut object, a first piece seen by both callbacks) adds nothing.
local function add(self, txn, prompt, completion)
    local key = self.key
    if key == nil then
        key = (txn:get_var("txn.tenant") or "-") .. " " .. where(self, txn)
    end
    local total = totals[key]
    if total == nil then
        total = { 0, 0, 0 }
        totals[key] = total
    end
    local had_prompt, had_completion = self.prompt, self.completion
    if had_prompt == nil then
        total[1] = total[1] + 1
        if not self.stream then -- read no further: nothing to keep
            total[2] = total[2] + prompt
            total[3] = total[3] + completion
            return
        end
        self.key = key
        had_prompt, had_completion = 0, 0
    end
    if prompt > had_prompt then
        total[2] = total[2] + prompt - had_prompt
        had_prompt = prompt
    end
    if completion > had_completion then
        total[3] = total[3] + completion - had_completion
        had_completion = completion
    end
    self.prompt, self.completion = had_prompt, had_completion
end

-- Whether an answer's reading is over: a whole answer's once its usage is counted, a stream's at its
-- [DONE] (a running usage is not its last), which ends the stream and so its last piece. Looked for
-- only there, followed by its newline: no event's JSON has a raw newline in a string, so that is the
-- event and not an answer's text. A [DONE] cut from its newline is not seen, and the stream is read
-- on to its end, which is all that follows it.
local function ended(self, text, prompt)
    if self.stream then
        local at = find(text, "data: [DONE]", -DONE_AT_END, true)
        return at ~= nil and find(text, "^\r?\n", at + 12) ~= nil
    end
    return prompt ~= nil
end

-- On each message's headers (2.6 calls it for the request's too). An answer's are where a stream is told
-- apart (its headers are gone by its first data), and where an answer that came whole with them (most
-- whole answers do: a few hundred bytes) is read and counted at once, so that it costs no `http_payload`
-- call; the answer's data is registered for only when its end is not there yet.
function Usage:http_headers(txn, msg)
    if msg ~= txn.http_res then
        return
    end
    local fetch = txn.f
    local content_type = fetch:res_fhdr("content-type")
    local stream = content_type ~= nil and find(content_type, "text/event-stream", 1, true)
    if stream then
        if fetch:fe_name() == RELAY_FRONTEND then
            return -- the relay counts it (llmgw_relay_count), with no callback a piece
        end
        self.stream = true
    else
        self.arrived = nil -- not timed
    end
    local body = fetch:res_body() -- what came with the headers
    if body ~= nil and body ~= "" then
        local arrived = self.arrived
        if arrived then
            self.arrived = nil
            first_token(self, txn, arrived)
        end
        local prompt, completion = usage_in(body)
        if prompt then
            add(self, txn, prompt, completion)
        end
        if ended(self, body, prompt) then
            return
        end
    end
    -- The data filter sees the answer from its first byte, what was read here included.
    filter.register_data_filter(self, msg.channel)
end

-- What was read in `text` (usage_in's answer) taken in: its usage counted; true once its end is seen (a
-- whole answer's usage, a stream's [DONE]), after which the rest needs no reading; else a usage or key cut
-- at its end is kept for the next read. `txn` is not used where `self.key` and `self.where` are known (a
-- relayed stream's count).
local function took(self, txn, text, prompt, completion, cut)
    if prompt then
        add(self, txn, prompt, completion)
    end
    if ended(self, text, prompt) then
        return true
    end
    if cut then
        local tail = sub(text, cut)
        self.tail = #tail <= TAIL and tail or nil
    else
        -- A key itself cut between two pieces: at most its first 8 bytes ("timings) end this one, from a quote.
        local quote = find(text, '"', -8, true)
        self.tail = quote and sub(text, quote) or nil
    end
    return false
end

-- A piece of an answer after its headers: a stream's first bytes timed, then read (took).
local function read_piece(self, txn, text)
    local arrived = self.arrived
    if arrived then
        self.arrived = nil
        first_token(self, txn, arrived)
    end
    local tail = self.tail
    if tail then
        text = tail .. text
    end
    return took(self, txn, text, usage_in(text))
end

-- Each piece of an answer until its end is seen; then the rest passes unread (no callback per later
-- chunk, none at the end: each Lua call costs microseconds).
function Usage:http_payload(txn, msg)
    local data = msg:body() -- this piece only: what came before was seen by an earlier call
    if data ~= nil and data ~= "" and read_piece(self, txn, data) then
        filter.unregister_data_filter(self, msg.channel)
    end
end

core.register_filter("llmgw_usage", Usage, function(usage, args)
    return usage
end)

-- The stream relay's count (deploy/gateway_relay.lua, loaded after this file, in the same Lua state). The
-- relay has each piece of the event streams it relays in hand, so it keeps them here, and they are read
-- together (read_relayed): when KEEP have gathered (or KEEP_BYTES: an engine's event may be large), when
-- the totals are taken, and at the stream's end. A
-- stream whose client goes away is read at the next take, as far as the relay got. The filter, reading
-- every piece as it passes, costs a callback and a usage read a piece (about 20,000 instructions with a
-- running usage on every event); kept, a piece costs a store, and a read reads one or two pieces.
local KEEP = 64
local KEEP_BYTES = 65536
-- Streams with pieces kept: false while some are unread, true once read (dropped at the next take if
-- nothing came since: ended, left, or between two tokens; their next piece keeps them again).
local relayed = {}

-- A relayed stream's kept pieces read: the latest first, then twice as many at each try until a whole
-- usage is found, and all of them after what the last read kept (its tail) only where none holds one. The
-- last whole usage in the latest pieces is the stream's last so far (a later one would be in them too), so
-- with a running usage on every event a read takes one or two pieces, however many wait.
local function read_relayed(count)
    local n = count.n
    count.n, count.bytes = 0, 0
    relayed[count] = true
    if n > 0 and not count.ended then
        local k = 1
        local text = count[n]
        local prompt, completion, cut = usage_in(text)
        while prompt == nil and k < n do
            k = k * 2 < n and k * 2 or n
            text = concat(count, "", n - k + 1, n)
            prompt, completion, cut = usage_in(text)
        end
        local tail = count.tail
        if prompt == nil and tail then
            text = tail .. text
            prompt, completion, cut = usage_in(text)
        end
        count.ended = took(count, nil, text, prompt, completion, cut)
    end
    for i = 1, n do
        count[i] = nil
    end
end

llmgw_relay_count = {
    -- A stream's count, from its tenant, model and server, and its arrival (core.now()).
    start = function(tenant, model, server, arrived)
        local place = model .. " " .. server
        return { stream = true, arrived = arrived, where = place, key = tenant .. " " .. place, n = 0, bytes = 0 }
    end,
    -- A piece relayed: its time if it is the first (as it passes, not when read), and kept.
    piece = function(count, data)
        local arrived = count.arrived
        if arrived then
            count.arrived = nil
            first_token(count, nil, arrived)
        end
        local n, bytes = count.n + 1, count.bytes + #data
        count[n], count.n, count.bytes = data, n, bytes
        if n >= KEEP or bytes >= KEEP_BYTES then
            read_relayed(count)
        elseif n == 1 then
            relayed[count] = false
        end
    end,
    -- The stream's end (whole or cut): what is kept read now.
    finish = function(count)
        read_relayed(count)
        relayed[count] = nil
    end,
}

-- `llmgw usage take`: one line per tenant, model and server: `TENANT MODEL SERVER requests prompt_tokens
-- completion_tokens`; then one per model and server with streams timed: `ttft MODEL SERVER sum_us`
-- and the count in each bucket of BOUNDS_US, the last over all of them (a tenant line has 6 fields,
-- a ttft line 4 + #BOUNDS_US + 1).
core.register_cli({ "llmgw", "usage", "take" }, "llmgw usage take : hand over the tokens counted, and zero them",
    function(applet)
        for count, read in pairs(relayed) do
            if read then
                relayed[count] = nil
            else
                read_relayed(count)
            end
        end
        local taken, timed = totals, first_tokens
        totals, first_tokens = {}, {}
        for key, total in pairs(taken) do
            applet:send(key .. " " .. total[1] .. " " .. total[2] .. " " .. total[3] .. "\n")
        end
        for key, counts in pairs(timed) do
            applet:send("ttft " .. key .. " " .. concat(counts, " ") .. "\n")
        end
    end)
