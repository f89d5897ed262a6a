"""`gpu-topology-agent`: publish this node's GPU topology and GPU state as node annotations (DESIGN §6).

Exit codes: 0 after SIGTERM/SIGINT, or after a successful `--once`; 1 when NVML or the Kubernetes API cannot
be used (the DaemonSet restarts it); 2 for bad arguments or a capture it cannot read (one line, no traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from topology.annotations import DEFAULT_PREFIX, AnnotationKeys
from topology.cli import CliError, load_topology
from topology.codec import CodecError
from topology.discover import SYSFS_ROOT, NvmlUnavailable, discover
from topology.nvidia_smi import TopoParseError
from topology.agent.devices import DEFAULT_SOCKET
from topology.agent.loop import DEFAULT_RESOURCE, Node, NodeError, PrintingNode, Reporter

PROG = "gpu-topology-agent"
EXIT_FAILURE = 1
EXIT_USAGE = 2

log = logging.getLogger(PROG)


class _Usage(Exception):
    """Bad arguments or input: exit 2."""


def main(argv: Sequence[str] | None = None, *, nvml: ModuleType | None = None, sysfs: Path = SYSFS_ROOT) -> int:
    """`nvml` and `sysfs` replace the real pynvml and /sys (tests drive the reporter with a fake NVML)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    closers: list = []
    try:
        try:
            reporter = _build(args, nvml, sysfs, stop, closers)
        except (_Usage, CliError, TopoParseError, CodecError, ValueError) as error:
            return _error(error, EXIT_USAGE)
        code = _run(reporter, stop, once=args.once)
        return _error(reporter.last_error, code) if code and reporter.last_error else code
    except (NvmlUnavailable, NodeError) as error:
        return _error(error, EXIT_FAILURE)
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()


def _error(error: object, code: int) -> int:
    print(f"{PROG}: error: {error}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME, from the downward API's spec.nodeName)")
    access = parser.add_mutually_exclusive_group()
    access.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster when run in a pod, "
                                             "else $KUBECONFIG or ~/.kube/config)")
    access.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    parser.add_argument("--socket", default=DEFAULT_SOCKET,
                        help=f"the kubelet's pod-resources socket (default: {DEFAULT_SOCKET})")
    parser.add_argument("--interval", type=_seconds, default=5.0, help="seconds between polls (default: 5)")
    parser.add_argument("--heartbeat", type=_seconds, default=30.0,
                        help="seconds after which an unchanged state is written again (default: 30)")
    parser.add_argument("--from-topo", metavar="FILE",
                        help="take the topology from a `nvidia-smi topo -m` capture (or topology JSON, or a "
                             "bundled platform name) instead of NVML; GPUs are then named GPU<index>, the device "
                             "plugin must use DEVICE_ID_STRATEGY=index, and NVML health is not read")
    parser.add_argument("--gpu-model", help="GPU model for --from-topo, e.g. 'NVIDIA A100-SXM4-80GB'")
    parser.add_argument("--dry-run", action="store_true",
                        help="print each patch's annotations as a JSON line instead of patching the node")
    parser.add_argument("--once", action="store_true", help="one round, then exit")
    parser.add_argument("--annotation-prefix", default=DEFAULT_PREFIX, help=f"default: {DEFAULT_PREFIX}")
    parser.add_argument("--gpu-resource", default=DEFAULT_RESOURCE, help=f"default: {DEFAULT_RESOURCE}")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 and at most 86400 seconds")
    return value


def _build(args: argparse.Namespace, nvml: ModuleType | None, sysfs: Path, stop: threading.Event,
           closers: list) -> Reporter:
    keys = AnnotationKeys(args.annotation_prefix)
    if args.gpu_model and not args.from_topo:
        raise _Usage("--gpu-model only applies with --from-topo (NVML names the GPU itself)")
    if not args.dry_run and not args.node_name:
        raise _Usage("no node name: set NODE_NAME (the downward API's spec.nodeName) or pass --node-name")
    if args.from_topo:
        topology = load_topology(args.from_topo, args.gpu_model)[1]
        health = None
    else:
        topology = discover(nvml, sysfs)
        from topology.agent.health import NvmlHealth

        health = NvmlHealth(nvml).open()
        closers.append(health.close)
    node = PrintingNode() if args.dry_run else _node(args)
    from topology.agent.podresources import PodResourcesClient

    devices = PodResourcesClient(args.socket)
    closers.append(devices.close)
    log.info("%s: %d GPUs (%s), topology from %s", args.node_name or "(dry run)", topology.size,
             topology.gpus[0].model, args.from_topo or "NVML")
    return Reporter(topology, node, devices, health, keys=keys, gpu_resource=args.gpu_resource,
                    interval=args.interval, heartbeat=args.heartbeat, stop=stop)


def _node(args: argparse.Namespace) -> Node:
    from topology.agent.kube import NodeApi

    if args.kubeconfig:
        return NodeApi.from_kubeconfig(args.kubeconfig, args.node_name)
    if args.in_cluster or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return NodeApi.in_cluster(args.node_name)
    return NodeApi.from_kubeconfig(None, args.node_name)


def _run(reporter: Reporter, stop: threading.Event, *, once: bool) -> int:
    """The loop runs in a worker thread, so the signal handler (always in the main thread) only sets an
    Event that the main thread never holds: it cannot deadlock against the loop's own waits."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["code"] = reporter.run(once=once)
        except BaseException as error:  # handed to the main thread, which reports it
            outcome["error"] = error

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        worker = threading.Thread(target=work, name="reporter")
        worker.start()
        while worker.is_alive():
            worker.join(0.5)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return int(outcome.get("code", EXIT_FAILURE))  # type: ignore[call-overload]


if __name__ == "__main__":
    sys.exit(main())
