"""`python -m agent --config FILE`: run the node agent (see docs/agent.md)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time

from agent import config as agent_config
from agent import protocol
from agent.client import Rejected, Unavailable
from agent.discovery import MissingAdapter
from agent.loop import Agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description="The llmgw node agent.")
    parser.add_argument("--config", required=True, help="YAML configuration file (docs/agent.md)")
    parser.add_argument("--once", action="store_true", help="sample one interval, send one heartbeat, exit")
    parser.add_argument("--print", action="store_true", help="with --once: print the heartbeat instead of sending it")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    if args.print and not args.once:
        parser.error("--print goes with --once")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        config = agent_config.load(args.config)
        agent = Agent(config)
        if not args.once:
            # Installed before start-up, which starts engines: a SIGTERM from then on stops them.
            signal.signal(signal.SIGTERM, lambda signum, frame: agent.stop())
            signal.signal(signal.SIGINT, lambda signum, frame: agent.stop())
        agent.start_up(run_shards=not args.once)
    except (agent_config.ConfigError, MissingAdapter) as exc:
        print(f"agent: {args.config}: {exc}", file=sys.stderr)
        return 2

    if args.once:
        return once(agent, send=not args.print)
    return agent.run()


def once(agent: Agent, send: bool) -> int:
    time.sleep(agent.interval)
    load = agent.sample_now()
    if not send:
        sys.stdout.write(protocol.encode(agent.heartbeat_message(load, with_inventory=True)).decode() + "\n")
        return 0
    try:
        reply = agent.beat_once()
    except (Unavailable, Rejected) as exc:
        print(f"agent: heartbeat failed: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(protocol.encode(reply).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
