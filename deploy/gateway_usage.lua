-- The gateway's usage counter: prompt and completion tokens per tenant, model and server, as the
-- engines report them in `usage` (the JSON body of an answer, or a stream's last event before
-- [DONE], which engines send when the request asks `stream_options: {"include_usage": true}`).
--
-- Loaded by deploy/gateway.cfg (`lua-load`, one thread: Debian's 2.6 Lua filter crashed with two).
-- Totals stay in this process until the sync takes them with `llmgw usage take` on the admin
-- socket, which answers them and starts again from zero, so each token is handed over once.

local totals = {}

-- The last `usage` object seen in an answer: a stream's comes at its end. The tail of what was
-- seen before is kept, so an object cut between two pieces of the answer is still found whole.
local TAIL = 1024

local function find_usage(text)
    local prompt, completion
    for object in string.gmatch(text, '"usage"%s*:%s*(%b{})') do
        local p = string.match(object, '"prompt_tokens"%s*:%s*(%d+)')
        local c = string.match(object, '"completion_tokens"%s*:%s*(%d+)')
        if p and c then
            prompt, completion = tonumber(p), tonumber(c)
        end
    end
    return prompt, completion
end

local Usage = {}
Usage.id = "llmgw usage"
Usage.flags = filter.FLT_CFG_FL_HTX
Usage.__index = Usage

function Usage:new()
    return setmetatable({ tail = "" }, Usage)
end

function Usage:start_analyze(txn, chn)
    if chn:is_resp() then
        filter.register_data_filter(self, chn)
    end
end

local function add(txn, prompt, completion)
    local tenant = txn:get_var("txn.tenant") or "-"
    local model = txn:get_var("txn.model") or "-"
    local server = txn.f:srv_name() or "-"
    local key = tenant .. " " .. model .. " " .. server
    local total = totals[key]
    if total == nil then
        total = { 0, 0, 0 }
        totals[key] = total
    end
    total[1] = total[1] + 1
    total[2] = total[2] + prompt
    total[3] = total[3] + completion
end

-- An answer has one `usage`: counted as soon as it is whole, then the rest of the answer passes
-- unread (no callback per later chunk, none at the end: each Lua call costs microseconds).
function Usage:http_payload(txn, msg)
    local data = msg:body(0, -1)
    if data == nil or data == "" then
        return
    end
    local text = self.tail .. data
    local prompt, completion = find_usage(text)
    if prompt then
        add(txn, prompt, completion)
        filter.unregister_data_filter(self, msg.channel)
        return
    end
    self.tail = string.sub(text, -TAIL)
end

core.register_filter("llmgw_usage", Usage, function(usage, args)
    return usage
end)

-- `llmgw usage take`: one line per tenant, model and server: requests prompt_tokens completion_tokens.
core.register_cli({ "llmgw", "usage", "take" }, "llmgw usage take : hand over the tokens counted, and zero them",
    function(applet)
        local taken = totals
        totals = {}
        for key, total in pairs(taken) do
            applet:send(key .. " " .. total[1] .. " " .. total[2] .. " " .. total[3] .. "\n")
        end
    end)
