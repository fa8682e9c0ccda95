"""A Python agent in its own process, for tests that signal or block it.

    agent_process.py --sidecar HOST:PORT --name NAME --capability CAP [--delay S]
                     [--max-concurrency N] [--block-on CAP]

Answers CAP with "<name>@<instance>:<payload>" after --delay seconds; a call to the
--block-on capability blocks the event loop with time.sleep(payload seconds). Prints
"READY <instance id>" once registered; SIGTERM shuts it down gracefully, after which it
prints "HANDLED <n>" to stderr.
"""

import argparse
import asyncio
import sys
import time

from agent_reach import Agent, Call, Reply


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sidecar", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--capability", action="append", default=[])
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--max-concurrency", type=int, default=0)
    p.add_argument("--block-on", default="")
    p.add_argument("--drain-timeout", type=float, default=20.0)
    args = p.parse_args()
    agent = Agent(args.name, version="1.0.0", sidecar=args.sidecar, max_concurrency=args.max_concurrency,
                  drain_timeout=args.drain_timeout, register_timeout=10)

    for cap in args.capability:
        @agent.capability(cap)
        async def echo(call: Call) -> Reply:
            if args.delay:
                await asyncio.sleep(args.delay)
            return Reply.text(f"{args.name}@{call.instance_id}:{call.text()}")

    if args.block_on:
        @agent.capability(args.block_on)
        async def block(call: Call) -> Reply:
            time.sleep(float(call.text()))  # a long synchronous step: the loop is stuck
            return Reply.text("unblocked")

    started = asyncio.Event()

    async def announce() -> None:
        while not agent.instance_id:
            await asyncio.sleep(0.01)
        print(f"READY {agent.instance_id}", flush=True)
        started.set()

    task = asyncio.create_task(announce())
    await agent.serve()
    task.cancel()
    print(f"HANDLED {agent.handled}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
