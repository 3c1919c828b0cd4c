"""A simulated serving fleet for bench/routing.py and bench/gateway.py, all on loopback.

`engine` is a stand-in inference engine with real queueing (slots, a queue behind
them, tokens per second, a prefix cache) speaking the OpenAI chat API; `client`
is the load generator that times every request to its first token; `proxy` renders
and runs the HAProxy configurations the benchmarks compare.
"""
