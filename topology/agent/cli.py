"""`gpu-topology-agent`: publish this node's GPU topology and state, and optionally serve its GPU device plugin.

The topology and state are node annotations (DESIGN §6); with `--mode deliver` the agent also serves the
kubelet device plugin that makes containers get exactly the GPUs the extender bound.

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
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from topology import bounds
from topology.agent.allocate import DEFAULT_CDI_KIND, DEFAULT_STRATEGIES, Delivery, Strategy, parse_strategies
from topology.agent.devices import DEFAULT_SOCKET, GpuIds, Unknown
from topology.agent.dra import DEFAULT_DRIVER as DEFAULT_DRA_DRIVER
from topology.agent.dra import DraDevices, index_minors, read_minors
from topology.agent.reporter import DEFAULT_RESOURCE, HealthSource, NodeError, PrintingNode, Reporter
from topology.annotations import DEFAULT_PREFIX, AnnotationKeys
from topology.cli import CliError, load_topology
from topology.codec import CodecError
from topology.discover import SYSFS_ROOT, NvmlUnavailable, _import_pynvml, discover, read_domain
from topology.fabric import Domain
from topology.model import Topology
from topology.nvidia_smi import TopoParseError
from topology.version import add_version

if TYPE_CHECKING:
    from topology.agent.deviceplugin import DevicePlugin
    from topology.agent.kube import NodeApi

PROG = "gpu-topology-agent"
EXIT_FAILURE = 1
EXIT_USAGE = 2
REPORT, DELIVER = "report", "deliver"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"

log = logging.getLogger(PROG)


class _Usage(Exception):
    """Bad arguments or input: exit 2."""


def main(argv: Sequence[str] | None = None, *, nvml: ModuleType | None = None, sysfs: Path = SYSFS_ROOT) -> int:
    """`nvml` and `sysfs` replace the real pynvml and /sys (tests drive the reporter with a fake NVML)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.holders:
        return _holders(args, nvml, sysfs)
    stop = threading.Event()
    closers: list = []
    try:
        try:
            reporter, plugin = _build(args, nvml, sysfs, stop, closers)
        except (_Usage, CliError, TopoParseError, CodecError, ValueError) as error:
            return _error(error, EXIT_USAGE)
        code = _run(reporter, plugin, stop, once=args.once)
        return _error(reporter.last_error, code) if code and reporter.last_error else code
    except (NvmlUnavailable, NodeError) as error:
        return _error(error, EXIT_FAILURE)
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()


def _holders(args: argparse.Namespace, nvml: ModuleType | None, sysfs: Path) -> int:
    from topology.agent.holders import holders_table
    from topology.agent.podresources import PodResourcesClient, PodResourcesUnavailable

    try:
        topology = load_topology(args.from_topo, args.gpu_model)[1] if args.from_topo else discover(nvml, sysfs)
    except (CliError, TopoParseError, CodecError, ValueError) as error:
        return _error(error, EXIT_USAGE)
    except NvmlUnavailable as error:
        return _error(error, EXIT_FAILURE)
    client = PodResourcesClient(args.socket, dra_driver=args.dra_driver)
    try:
        dra = _dra(args, topology, nvml)
        listed = client.listed(args.gpu_resource) if dra is None else dra.listed(client.read())
    except _Usage as error:
        return _error(error, EXIT_USAGE)
    except (PodResourcesUnavailable, NvmlUnavailable) as error:
        return _error(error, EXIT_FAILURE)
    finally:
        client.close()
    if isinstance(listed, Unknown):
        return _error(listed.reason, EXIT_FAILURE)
    sys.stdout.write(holders_table(topology, listed))
    return 0


def _error(error: object, code: int) -> int:
    print(f"{PROG}: error: {error}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_version(parser)
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
    parser.add_argument("--mode", choices=(REPORT, DELIVER), default=REPORT,
                        help="report: publish the annotations only, beside the stock device plugin (default); "
                             "deliver: also serve the device plugin that gives containers the GPUs the extender "
                             "bound (switch the GPU operator's device plugin off on the node)")
    parser.add_argument("--device-plugin-dir", default=DEFAULT_PLUGIN_DIR,
                        help=f"the kubelet's device-plugins directory (default: {DEFAULT_PLUGIN_DIR})")
    parser.add_argument("--device-list-strategy", type=_strategies, default=DEFAULT_STRATEGIES,
                        metavar="LIST", help="how Allocate hands GPUs to the runtime, a comma list of "
                        f"{', '.join(s.value for s in Strategy)} (default: "
                        f"{','.join(s.value for s in DEFAULT_STRATEGIES)}, as the GPU operator with CDI)")
    parser.add_argument("--cdi-kind", default=DEFAULT_CDI_KIND,
                        help=f"the CDI kind of the cdi-* strategies' device names (default: {DEFAULT_CDI_KIND})")
    parser.add_argument("--numa-topology", action="store_true",
                        help="report each GPU's NUMA node to the kubelet; the Topology Manager (best-effort, "
                             "restricted, single-numa-node) may then override the GPUs the extender chose")
    parser.add_argument("--dra-driver", type=_driver, metavar="DRIVER",
                        help=f"a DRA node, whose GPUs this DRA driver hands out (NVIDIA's: {DEFAULT_DRA_DRIVER}): "
                             "read which pod holds which GPU from the claims the kubelet prepared; no device plugin")
    parser.add_argument("--holders", action="store_true",
                        help="print which container holds which GPUs on this node (the kubelet's pod-resources), "
                             "with each set's ring bandwidth, then exit")
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


def _driver(text: str) -> str:
    if len(text) > bounds.MAX_DRIVER_NAME_LENGTH or not bounds.DNS_SUBDOMAIN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a DRA driver name (a DNS subdomain of at most "
                                         f"{bounds.MAX_DRIVER_NAME_LENGTH} characters)")
    return text


def _strategies(text: str) -> tuple[Strategy, ...]:
    try:
        return parse_strategies(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _build(args: argparse.Namespace, nvml: ModuleType | None, sysfs: Path, stop: threading.Event,
           closers: list) -> tuple[Reporter, DevicePlugin | None]:
    """The reporter and, with `--mode deliver`, the device plugin: one topology, one NVML health check per
    round, one pod-resources client for both."""
    keys = AnnotationKeys(args.annotation_prefix)
    deliver = args.mode == DELIVER
    if args.gpu_model and not args.from_topo:
        raise _Usage("--gpu-model only applies with --from-topo (NVML names the GPU itself)")
    if not args.dry_run and not args.node_name:
        raise _Usage("no node name: set NODE_NAME (the downward API's spec.nodeName) or pass --node-name")
    if args.dra_driver and deliver:
        raise _Usage("--dra-driver: on a DRA node the DRA driver hands out the GPUs, and no device plugin may serve "
                     "them beside it: it cannot run with --mode deliver")
    if deliver and (args.once or args.dry_run):
        raise _Usage("--mode deliver serves the kubelet until stopped and reads this node's pods from the API "
                     "server: it cannot run with --once or --dry-run")
    delivery = Delivery(args.device_list_strategy, args.cdi_kind)
    fabric: Callable[[], Domain] | None = None
    if args.from_topo:
        topology = load_topology(args.from_topo, args.gpu_model)[1]
        health: HealthSource | None = None
    else:
        nvml = nvml or _import_pynvml()
        topology = discover(nvml, sysfs)
        from topology.agent.health import NvmlHealth

        nvml_health = NvmlHealth(nvml).open()
        closers.append(nvml_health.close)
        health = nvml_health
        fabric = partial(read_domain, nvml, topology.size)  # each round, while the health check holds NVML open
    dra = _dra(args, topology, nvml)
    from topology.agent.kube import NodeApi

    node = PrintingNode() if args.dry_run else _kube(NodeApi, args)
    from topology.agent.podresources import PodResourcesClient

    devices = PodResourcesClient(args.socket, dra_driver=args.dra_driver)
    closers.append(devices.close)
    plugin = None
    if deliver:
        from topology.agent.deviceplugin import DevicePlugin, SharedHealth
        from topology.agent.pods import NodePods

        plugin = DevicePlugin(topology, devices, _kube(NodePods, args, timeout=2.0), keys=keys,
                              resource=args.gpu_resource, plugin_dir=args.device_plugin_dir, delivery=delivery,
                              numa_topology=args.numa_topology)
        health = SharedHealth(health, plugin) if health is not None else None
    log.info("%s: %d GPUs (%s), topology from %s, mode %s", args.node_name or "(dry run)", topology.size,
             topology.gpus[0].model, args.from_topo or "NVML",
             f"{args.mode}, GPUs from DRA driver {args.dra_driver}" if dra else args.mode)
    reporter = Reporter(topology, node, devices, health, fabric=fabric, dra=dra, keys=keys,
                        gpu_resource=args.gpu_resource, interval=args.interval, heartbeat=args.heartbeat, stop=stop)
    return reporter, plugin


def _dra(args: argparse.Namespace, topology: Topology, nvml: ModuleType | None) -> DraDevices | None:
    """With `--dra-driver`: the driver's devices in this node's pool (named after the node), joined to the topology
    by NVML's minor numbers, or by index with `--from-topo`."""
    if not args.dra_driver:
        return None
    if not args.node_name:
        raise _Usage("--dra-driver needs this node's name, the name of the driver's pool: set NODE_NAME or pass "
                     "--node-name")
    ids = GpuIds(topology)
    minors = index_minors(ids) if args.from_topo else read_minors(nvml or _import_pynvml(), ids)
    return DraDevices(args.dra_driver, args.node_name, minors)


def _kube(api: type[NodeApi], args: argparse.Namespace, **kwargs: float) -> NodeApi:
    """This node's API (`NodeApi`, or `NodePods`) through the kubeconfig or the pod's service account."""
    if args.kubeconfig:
        return api.from_kubeconfig(args.kubeconfig, args.node_name, **kwargs)
    if args.in_cluster or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return api.in_cluster(args.node_name, **kwargs)
    return api.from_kubeconfig(None, args.node_name, **kwargs)


def _run(reporter: Reporter, plugin: DevicePlugin | None, stop: threading.Event, *, once: bool) -> int:
    """The loops run in worker threads, so the signal handler (always in the main thread) only sets an
    Event that the main thread never holds: it cannot deadlock against the loops' own waits. The reporter's
    end (an NVML failure, or `--once`) stops the device plugin too."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["code"] = reporter.run(once=once)
        except BaseException as error:  # handed to the main thread, which reports it
            outcome["error"] = error
        finally:
            stop.set()

    def serve() -> None:
        assert plugin is not None
        try:
            plugin.run(stop)
        except BaseException as error:  # a bug: stop the reporter too, so the DaemonSet restarts the agent
            log.exception("the device plugin failed")
            outcome.setdefault("error", error)
            stop.set()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        workers = [threading.Thread(target=work, name="reporter")]
        if plugin is not None:
            workers.append(threading.Thread(target=serve, name="device-plugin"))
        for worker in workers:
            worker.start()
        for worker in workers:
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
