"""Wait until a Ray cluster has the nodes and GPUs a job expects (used by slurm/bootstrap.sh).

usage: python slurm/lib/wait_for_ray.py --address HOST:PORT --nodes N --gpus G [--timeout S]

Exits 0 once at least N nodes are alive and they hold at least G GPUs; exits 1 after S seconds
with what did join, so a worker that never came up fails the job at once instead of leaving
the driver to hang on a placement group that can never be scheduled.
"""

from __future__ import annotations

import argparse
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="Ray head address HOST:PORT")
    parser.add_argument("--nodes", type=int, required=True, help="alive nodes to wait for")
    parser.add_argument("--gpus", type=float, default=0.0, help="GPUs the nodes must hold together")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before giving up")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Poll ``ray.nodes()`` until the cluster is complete or the timeout passes."""
    args = _parser().parse_args(argv)
    import ray  # the project's Ray; imported here so --help works without it

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    deadline = time.monotonic() + args.timeout
    try:
        while True:
            alive = [node for node in ray.nodes() if node.get("Alive")]
            gpus = sum(node.get("Resources", {}).get("GPU", 0.0) for node in alive)
            if len(alive) >= args.nodes and gpus >= args.gpus:
                print(f"wait_for_ray: {len(alive)} nodes with {gpus:g} GPUs joined {args.address}")
                return 0
            if time.monotonic() > deadline:
                names = ", ".join(sorted(str(node.get("NodeManagerHostname")) for node in alive)) or "none"
                print(
                    f"wait_for_ray: after {args.timeout:g} s only {len(alive)} of {args.nodes} nodes and "
                    f"{gpus:g} of {args.gpus:g} GPUs joined the Ray head at {args.address} (joined: {names}); "
                    "a worker's `ray start` failed or cannot reach the head: see this job's error log",
                    file=sys.stderr,
                )
                return 1
            time.sleep(2.0)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
