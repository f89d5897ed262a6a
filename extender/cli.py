"""`gpu-topology-extender`: serve the extender (demo cluster, kubeconfig or in-cluster), or run the demo."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from extender.api.dra import GPU_CLASS, GPU_DRIVER, valid_driver
from extender.api.group_request import KINDS
from extender.api.pod_request import DEFAULT_GPU_RESOURCE
from extender.cache.cluster_state import ClusterState
from extender.cache.domains import DomainIndex
from extender.cache.ledger import BIND_OUTCOME_SECONDS
from extender.cache.seal import Seal
from extender.demo.cluster import DemoCluster
from extender.demo.dra import run_dra_demo
from extender.demo.groups import run_groups_demo
from extender.demo.mixed_pods import run_demo
from extender.demo.shared import run_shared_demo
from extender.groups.plans import GROUP_TIMEOUT_SECONDS
from extender.groups.sizes import GroupSizes
from extender.kube.client import KubeError, KubernetesApi
from extender.kube.leader_election import LeaderElector, Timings
from extender.kube.leader_label import LeaderLabel
from extender.kube.reflector import Reflector, Tee
from extender.pinning.planner import PIN_TIMEOUT_SECONDS, PinPlanner
from extender.server.gc_freeze import settle_when_synced
from extender.server.serve import ServeOptions, serve
from extender.verbs.group_placement import GROUP_AGE_BOUND_SECONDS
from extender.verbs.service import ExtenderService
from extender.verbs.scoring.shortlist import SHORTLIST
from extender.verbs.wait import TOPOLOGY_WAIT_SECONDS
from topology.annotations import DEFAULT_PREFIX, AnnotationKeys
from topology.backoff import Backoff
from topology.bounds import MAX_TOPOLOGY_WAIT_SECONDS
from topology.collectives import COMM_SHARE, parse_comm_share
from topology.select import Selector
from topology.version import add_version

log = logging.getLogger("gpu-topology-extender")
DEMO_HEARTBEAT_SECONDS = 30.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEASE_NAME = "gpu-topology-extender"
DEFAULT_TIMINGS = Timings()
BIND_CALLS = 3  # API calls a bind may make until its Binding is answered: read the pod, settle, bind


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.log_level = args.log_level or ("warning" if args.run is _demo else "info")
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (KubeError, ValueError, OSError) as error:
        print(f"gpu-topology-extender: error: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-topology-extender", description=__doc__)
    add_version(parser)
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        help="default: info for serve, warning for demo (its decisions are its output)")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve filter, prioritize, preempt and bind over HTTP(S)")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--demo", action="store_true", help="an in-memory cluster of real platforms")
    source.add_argument("--kubeconfig", metavar="PATH", help="talk to the cluster of this kubeconfig")
    source.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8888)
    serve.add_argument("--no-http2", dest="http2", action="store_false",
                       help="offer HTTP/1.1 alone on the main port, not HTTP/2 beside it (over TLS kube-scheduler's "
                            "client takes h2 when offered: each call a stream of one connection, "
                            "extender/server/http2.py)")
    serve.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="also listen on PORT of --host for GET /metrics, /healthz and /readyz alone (404 for "
                            "anything else, so no verb), over TLS with --tls-cert but asking no client certificate: a "
                            "scraper needs none that --client-name lets through (default: none; the main port serves "
                            "them too, as always)")
    serve.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate; it and --tls-key and "
                                                          "--client-ca are loaded again when their files change")
    serve.add_argument("--tls-key", metavar="FILE")
    serve.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA (mTLS)")
    serve.add_argument("--client-name", action="append", default=[], metavar="NAME",
                       help="with --client-ca, accept only client certificates whose subject CN or a DNS SAN is NAME "
                            "(repeatable; kube-scheduler's in scheduler-config/ is kube-scheduler); others get 403")
    serve.add_argument("--annotation-prefix", default=DEFAULT_PREFIX)
    serve.add_argument("--gpu-resource", default=DEFAULT_GPU_RESOURCE)
    serve.add_argument("--dra-drivers", type=_drivers, default=(GPU_DRIVER,), metavar="NAMES",
                       help="DRA drivers whose ResourceSlices publish GPUs, comma-separated; their claims' devices "
                            f"are the GPUs taken on those nodes; empty: DRA is not watched (default {GPU_DRIVER})")
    serve.add_argument("--dra-gpu-classes", type=_drivers, default=(GPU_CLASS,), metavar="NAMES",
                       help="DeviceClasses whose requests are for whole GPUs, comma-separated: a claim's requests of "
                            f"them count as the pod's GPUs (default {GPU_CLASS})")
    serve.add_argument("--pin-claims", action="store_true",
                       help="name the claims of pods whose ResourceClaimTemplates ask whole GPUs at admission (the "
                            "webhook of scheduler-config/dra-pin-webhook.yaml) and make them pinned by UUID to the "
                            "GPUs the extender chooses, where a DRA node's first fit would give less")
    serve.add_argument("--pin-timeout", type=float, default=PIN_TIMEOUT_SECONDS, metavar="SECONDS",
                       help="a pinned claim not allocated within this is made again elsewhere "
                            f"(default {PIN_TIMEOUT_SECONDS:g})")
    serve.add_argument("--stale-after", type=float, default=120.0, metavar="SECONDS",
                       help="treat a node whose GPU state is older than this as unknown")
    serve.add_argument("--seal-key-file", metavar="FILE",
                       help="the key that seals bind records (a Secret shared by the replicas); without it a key of "
                            "this process only, so after a restart pods bound but not yet started are known again "
                            "only once their node reports them")
    serve.add_argument("--bind-outcome-seconds", type=float, default=BIND_OUTCOME_SECONDS, metavar="SECONDS",
                       help="how long GPUs stay reserved for a Binding whose answer was lost, while the watch has "
                            "not shown where the pod went (default: kube-apiserver's request timeout, 60)")
    serve.add_argument("--topology-wait", type=float, default=TOPOLOGY_WAIT_SECONDS, metavar="SECONDS",
                       help="how long a pod of 2 GPUs or more that states no requirement of its own waits for a node "
                            "that can give it a full-bandwidth set (the best ring of its size on that node's board), "
                            "counted from the first time a node could hold it by count; then it takes the best ring "
                            f"on offer. 0: never wait (default {TOPOLOGY_WAIT_SECONDS:g}; see BENCHMARKS.md)")
    serve.add_argument("--topology-levels", type=_levels, default=(), metavar="KEY,KEY",
                       help="node-label keys of the network levels above the node, outermost first, as Kueue's "
                            "Topology levels (e.g. network.topology.nvidia.com/spine,network.topology.nvidia.com/leaf)"
                            "; a group's gpu-topology.io/group-span may name one. The NVLink domain (the node's "
                            "nvidia.com/gpu.clique) is always the innermost span")
    serve.add_argument("--group-timeout", type=float, default=GROUP_TIMEOUT_SECONDS, metavar="SECONDS",
                       help="how long a group's plan holds its GPUs for members still to come, from its last member "
                            f"bound (default {GROUP_TIMEOUT_SECONDS:g})")
    serve.add_argument("--group-age-bound", type=float, default=GROUP_AGE_BOUND_SECONDS, metavar="SECONDS",
                       help="a group that has waited this long for a domain drains the one predicted to free soonest, "
                            "the longest-waiting group first, one at a time; 0: never (default "
                            f"{GROUP_AGE_BOUND_SECONDS:g})")
    serve.add_argument("--comm-share", type=_share, default=COMM_SHARE, metavar="SHARE",
                       help="the share of a job's step time in all-reduce, 0 to 1, for pods that state no "
                            "comm-share: a preferred group waits for one NVLink domain as long as a split would cost "
                            f"it, and not at all at 0 (default {COMM_SHARE:g})")
    serve.add_argument("--shortlist", type=int, default=SHORTLIST, metavar="K",
                       help="filter passes at most K of the nodes that can serve a pod, those prioritize ranks best, "
                            "so kube-scheduler scores K nodes and not thousands; the rest are left out, never the "
                            "pod's last chance (extender/verbs/scoring/shortlist.py). 0: pass every fit "
                            f"(default {SHORTLIST})")
    serve.add_argument("--one-best", action="store_true", default=True,
                       help="pass one node, not the shortlist, to a pod for which kube-scheduler's scoring weighs "
                            "nothing of its own (no preferred affinity, no ScheduleAnyway spread, no owner "
                            "kube-scheduler spreads by default, no claims, no PreferNoSchedule taint it does not "
                            "tolerate on the node): kube-scheduler takes it without scoring or prioritize "
                            "(extender/api/preferences.py). The default: the replay places every pod as with the "
                            "shortlist, and kube-scheduler and the extender spend less (README.md)")
    serve.add_argument("--no-one-best", dest="one_best", action="store_false",
                       help="pass every such pod the shortlist, for kube-scheduler's own scoring to choose from")
    serve.add_argument("--observe", action="store_true",
                       help="observe only, to weigh the extender before it decides: prioritize scores as usual, filter "
                            "passes every node and counts what it would refuse (gpu_topology_extender_decisions_total"
                            "{verb=\"filter\",outcome=\"observed-refusal\"}), preempt keeps every node, and bind is "
                            "refused: kube-scheduler's configuration sets no bindVerb, so its own binder binds. No "
                            "shortlist, group plan or drain; not with --pin-claims")
    serve.add_argument("--api-timeout", type=float, default=1.2, metavar="SECONDS",
                       help="bound on each API call; bind makes one write (two calls after a conflict), which must "
                            "finish inside kube-scheduler's httpTimeout (3 s in scheduler-config/)")
    election = serve.add_argument_group(
        "leader election", "with several replicas, only the holder of a coordination.k8s.io Lease binds, and it labels "
        "its own Pod ($POD_NAMESPACE/$POD_NAME) with <annotation prefix>/leader=true for the Service to select (the "
        "timings are client-go's and kube-scheduler's flags of the same names)")
    election.add_argument("--leader-elect", action="store_true", help="take part in leader election (off by default)")
    election.add_argument("--leader-elect-lease-name", default=LEASE_NAME, metavar="NAME")
    election.add_argument("--leader-elect-namespace", metavar="NAMESPACE",
                          help="default: the service account's namespace, else 'default'")
    election.add_argument("--leader-elect-identity", metavar="ID", help="default: $POD_NAME, else the host name")
    election.add_argument("--leader-elect-lease-duration", type=int, default=DEFAULT_TIMINGS.lease_duration,
                          metavar="SECONDS", help="how long a Lease not renewed stays with its holder (default 15)")
    election.add_argument("--leader-elect-renew-deadline", type=float, default=DEFAULT_TIMINGS.renew_deadline,
                          metavar="SECONDS", help="how long a leader that cannot renew keeps acting (default 10)")
    election.add_argument("--leader-elect-retry-period", type=float, default=DEFAULT_TIMINGS.retry_period,
                          metavar="SECONDS", help="how often to renew, or to try to acquire (default 2)")
    serve.set_defaults(run=_serve)
    demo = commands.add_parser("demo", help="drive mixed pods, shared GPUs, groups on NVL72 racks and DRA nodes "
                                            "through the demo server, and compare with count-only placement")
    demo.set_defaults(run=_demo)
    return parser


def _drivers(text: str) -> tuple[str, ...]:
    """--dra-drivers and --dra-gpu-classes: DNS subdomains of at most 63 characters, as kube-apiserver admits a
    driver's name (a DeviceClass's may be longer; NVIDIA's are not)."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    for name in names:
        if not valid_driver(name):
            raise argparse.ArgumentTypeError(f"{name[:63]!r} is not a DNS subdomain of at most 63 characters")
    return names


def _share(text: str) -> float:
    try:
        return parse_comm_share(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _levels(text: str) -> tuple[str, ...]:
    """--topology-levels: distinct node-label keys, comma-separated."""
    levels = tuple(part.strip() for part in text.split(",") if part.strip())
    try:
        DomainIndex(levels)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return levels


def _serve(args: argparse.Namespace) -> int:
    options = ServeOptions(args.host, args.port, args.tls_cert, args.tls_key, args.client_ca, tuple(args.client_name),
                           args.log_level, metrics_port=args.metrics_port, http2=args.http2)
    if not 0 <= args.topology_wait <= MAX_TOPOLOGY_WAIT_SECONDS:
        raise ValueError(f"--topology-wait must be 0 to {MAX_TOPOLOGY_WAIT_SECONDS:g} seconds, "
                         f"not {args.topology_wait}")
    if args.leader_elect and args.demo:
        raise ValueError("--leader-elect needs a cluster (--kubeconfig or --in-cluster), not --demo")
    if args.leader_elect and not args.seal_key_file:
        # A new leader knows its predecessor's binds that the kubelets have not reported yet only by their seals.
        raise ValueError("--leader-elect needs --seal-key-file, the key every replica shares")
    timings = Timings(args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
                      args.leader_elect_retry_period) if args.leader_elect else None
    if timings is not None and BIND_CALLS * args.api_timeout >= timings.lease_duration - timings.renew_deadline:
        # A bind that starts just before the renew deadline must be answered before a successor can take over.
        raise ValueError(f"{BIND_CALLS} x --api-timeout must be shorter than the lease duration less the renew "
                         f"deadline ({timings.lease_duration} - {timings.renew_deadline:g} s)")
    own_pod = _own_pod() if timings is not None else None
    if args.seal_key_file:
        seal = Seal.from_file(args.seal_key_file)
    else:
        log.warning("no --seal-key-file: bind records are sealed with a key of this process only; after a restart, "
                    "pods bound but not yet started are known again only once their node reports them")
        seal = Seal.ephemeral()
    if not 0 <= args.group_age_bound <= MAX_TOPOLOGY_WAIT_SECONDS:
        raise ValueError(f"--group-age-bound must be 0 to {MAX_TOPOLOGY_WAIT_SECONDS:g} seconds, "
                         f"not {args.group_age_bound}")
    if args.shortlist < 0:
        raise ValueError(f"--shortlist must be 0 (pass every fit) or more, not {args.shortlist}")
    groups = {"group_timeout": args.group_timeout, "group_age_bound": args.group_age_bound or None,
              "comm_share": args.comm_share, "shortlist": args.shortlist,
              "one_best": args.one_best, "observe": args.observe}
    if not 0 < args.group_timeout <= MAX_TOPOLOGY_WAIT_SECONDS:
        raise ValueError(f"--group-timeout must be more than 0 and at most {MAX_TOPOLOGY_WAIT_SECONDS:g} seconds, "
                         f"not {args.group_timeout}")
    state = ClusterState(AnnotationKeys(args.annotation_prefix), args.gpu_resource, args.stale_after, seal=seal,
                         bind_outcome_seconds=args.bind_outcome_seconds, levels=args.topology_levels,
                         gpu_drivers=args.dra_drivers, gpu_classes=args.dra_gpu_classes)
    elector: LeaderElector | None = None
    label: LeaderLabel | None = None
    if args.demo:
        kube = DemoCluster(state)
        _heartbeat(kube)
        service = ExtenderService(state, kube, topology_wait=args.topology_wait, **groups)
    else:
        kube = (KubernetesApi.in_cluster(timeout=args.api_timeout) if args.in_cluster
                else KubernetesApi.from_kubeconfig(args.kubeconfig, timeout=args.api_timeout))
        selector = Selector()
        planner = PinPlanner(state, selector, kube, state.keys, state.clock, args.pin_timeout) \
            if args.pin_claims and args.dra_drivers else None
        nodes = Reflector(kube.list_nodes, kube.watch_nodes,
                          state.nodes if planner is None else Tee(state.nodes, planner.nodes), name="nodes")
        pods = Reflector(kube.list_pods, kube.watch_pods,
                         state.pods if planner is None else Tee(state.pods, planner.pods), name="pods")
        if timings is not None:
            elector = _elector(args, kube, timings)
        service = ExtenderService(state, kube, selector, leader=elector, pods=pods if elector else None,
                                  topology_wait=args.topology_wait, pin_claims=planner is not None, **groups)
        if planner is not None:
            planner.on_count = lambda outcome: service.metrics.decision("pin", outcome).inc()
            Reflector(kube.list_resource_claim_templates, kube.watch_resource_claim_templates, state.templates,
                      name="resourceclaimtemplates.resource.k8s.io").start()
            threading.Thread(target=planner.run, kwargs={"active": service.leads if elector is not None else None},
                             name="pin-planner", daemon=True).start()
        nodes.start()
        pods.start()
        if args.dra_drivers:
            state.watch_dra()
            Reflector(kube.list_resource_slices, kube.watch_resource_slices, state.slices,
                      name="resourceslices.resource.k8s.io").start()
            Reflector(kube.list_resource_claims, kube.watch_resource_claims, state.claims,
                      name="resourceclaims.resource.k8s.io").start()
        for kind in KINDS:  # a cluster without the CRD or the alpha API answers 404: ask every 5 minutes at most
            Reflector(lambda kind=kind: kube.list_pod_groups(kind),
                      lambda version, timeout, kind=kind: kube.watch_pod_groups(kind, version, timeout),
                      GroupSizes(kind, state.group_sizes), name=f"{kind.plural}.{kind.group}",
                      backoff=Backoff(initial=5.0, maximum=300.0, jitter=0.2)).start()
        if elector is not None and own_pod is not None:
            label = LeaderLabel(kube, *own_pod, state.keys.leader, service.leads)
            label.start()
            elector.start()
    threading.Thread(target=settle_when_synced, args=(state,), name="gc-settle", daemon=True).start()
    # uvicorn stops serving on SIGTERM, then raises it again: exit cleanly, through the `finally` below.
    signal.signal(signal.SIGTERM, _exit)
    try:
        serve(service, options)
    finally:
        if label is not None:  # the Service stops routing here first, then the Lease is handed over at once
            label.stop()
        if elector is not None:
            elector.stop()
    return 0


def _exit(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _elector(args: argparse.Namespace, kube: KubernetesApi, timings: Timings) -> LeaderElector:
    namespace = args.leader_elect_namespace or _service_account_namespace()
    identity = args.leader_elect_identity or os.environ.get("POD_NAME") or socket.gethostname()
    log.info("leader election on Lease %s/%s as %s", namespace, args.leader_elect_lease_name, identity)
    return LeaderElector(kube, namespace, args.leader_elect_lease_name, identity, timings)


def _own_pod() -> tuple[str, str]:
    """This replica's Pod (namespace, name), from the downward API, for the leader label."""
    name = os.environ.get("POD_NAME", "")
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not name or not namespace:
        raise ValueError("--leader-elect needs the environment variables POD_NAME and POD_NAMESPACE (the downward "
                         "API): the leader labels its own Pod so that the Service routes to it alone")
    return namespace, name


def _service_account_namespace() -> str:
    """The pod's own namespace, where its Lease lives; 'default' outside a cluster."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _demo(_: argparse.Namespace) -> int:
    run_demo()
    run_shared_demo()
    run_groups_demo()
    run_dra_demo()
    return 0


def _heartbeat(cluster: DemoCluster) -> None:
    """The demo's reporters republish every node's state, as the real ones do, so nothing goes stale."""
    def beat() -> None:
        while not stop.wait(DEMO_HEARTBEAT_SECONDS):
            cluster.refresh_all()
    stop = threading.Event()
    threading.Thread(target=beat, name="demo-heartbeat", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
