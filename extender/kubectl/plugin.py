"""`kubectl gputopo`: what the extender sees, from the API server, for people who live in kubectl.

    kubectl gputopo nodes                 one row per GPU node: free GPUs, best free rings, whole sets, domain, state
    kubectl gputopo node NAME             the link matrix, who holds each GPU, the best free sets
    kubectl gputopo pod NAME [-n NS]      a pod's GPUs, ring and delivery; or why it waits and where it could go

Installed as the executable `kubectl-gputopo`, which kubectl finds on PATH. kubectl's conventions: --kubeconfig,
--context, -n/--namespace, -o json|wide, exit code 0 or 1, and one line on stderr for any error (an unreachable
or missing cluster included), never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from extender.kube.client import KubeError, Unreachable
from extender.kubectl.snapshot import STALE_AFTER_SECONDS, Connection, PluginApi, Settings, read_cluster, read_node, \
    read_pod
from extender.api.pod_request import DEFAULT_GPU_RESOURCE
from extender.kubectl.render import node_text, nodes_table, pod_text
from extender.kubectl.views import gpu_node_names, node_detail, node_row, pod_report, to_json
from topology.annotations import DEFAULT_PREFIX, AnnotationKeys
from topology.select import Selector
from topology.version import add_version

PROG = "kubectl gputopo"
EXIT_ERROR = 1
# The state logs each node it refuses; here that reason is part of the output, not a warning on stderr.
logging.getLogger("extender").addHandler(logging.NullHandler())


class _Parser(argparse.ArgumentParser):
    """Usage errors end as kubectl's do: one line and exit code 1."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"error: {message}\nSee '{PROG} --help' for usage.\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        text = args.run(args)
    except (KubeError, ValueError) as error:  # ValueError: a flag's value, such as an --annotation-prefix
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_ERROR
    try:
        print(text)
    except BrokenPipeError:
        pass
    return 0


def _parser() -> argparse.ArgumentParser:
    # Flags go before or after the command, as with kubectl; SUPPRESS keeps a subcommand from resetting one given
    # before it, and the defaults are filled in afterwards.
    common = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument("-n", "--namespace", help="the pod's namespace (default: the context's, else default)")
    common.add_argument("-o", "--output", choices=["json", "wide"], help="json, or wide for more columns")
    common.add_argument("--request-timeout", type=float, metavar="SECONDS", help="per API call (default 30)")
    common.add_argument("--stale-after", type=float, metavar="SECONDS",
                        help=f"the extender's --stale-after (default {STALE_AFTER_SECONDS:g})")
    common.add_argument("--annotation-prefix", help=f"the extender's --annotation-prefix (default {DEFAULT_PREFIX})")
    common.add_argument("--gpu-resource", help=f"the extender's --gpu-resource (default {DEFAULT_GPU_RESOURCE})")
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0], parents=[common])
    add_version(parser)
    commands = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=_Parser)
    nodes = commands.add_parser("nodes", parents=[common], help="one row per GPU node")
    nodes.set_defaults(run=_connected(_nodes))
    node = commands.add_parser("node", parents=[common], help="one node's links, holders and free sets")
    node.add_argument("name", metavar="NAME")
    node.set_defaults(run=_connected(_node))
    pod = commands.add_parser("pod", parents=[common], help="one pod's GPUs, or why it waits")
    pod.add_argument("name", metavar="NAME")
    pod.set_defaults(run=_connected(_pod))
    return parser


def _connected(command: Callable[[argparse.Namespace, PluginApi, str, Settings], str]) -> Callable[
        [argparse.Namespace], str]:
    """The command with its client, namespace and settings, from the flags."""

    def run(args: argparse.Namespace) -> str:
        flags = vars(args)
        connection = Connection(flags.get("kubeconfig"), flags.get("context"), flags.get("namespace"),
                                flags.get("request_timeout", 30.0))
        settings = Settings(AnnotationKeys(flags.get("annotation_prefix", DEFAULT_PREFIX)),
                            flags.get("gpu_resource", DEFAULT_GPU_RESOURCE),
                            flags.get("stale_after", STALE_AFTER_SECONDS))
        api, namespace = connection.open()
        try:
            return command(args, api, namespace, settings)
        except Unreachable as error:
            raise Unreachable(f"the API server at {api.host} cannot be reached: {error.message}") from None

    return run


def _output(args: argparse.Namespace) -> str | None:
    return vars(args).get("output")


def _nodes(args: argparse.Namespace, api: PluginApi, _: str, settings: Settings) -> str:
    snap = read_cluster(api, settings)
    selector = Selector()
    rows = [node_row(snap, selector, name) for name in gpu_node_names(snap)]
    if _output(args) == "json":
        return to_json("GPUTopologyNodeList", {"items": rows})
    return nodes_table(rows, _output(args) == "wide")


def _node(args: argparse.Namespace, api: PluginApi, _: str, settings: Settings) -> str:
    detail = node_detail(read_node(api, args.name, settings), Selector(), args.name)
    if _output(args) == "json":
        return to_json("GPUTopologyNode", detail)
    return node_text(detail, _output(args) == "wide")


def _pod(args: argparse.Namespace, api: PluginApi, namespace: str, settings: Settings) -> str:
    pod, snap = read_pod(api, namespace, args.name, settings)
    report = pod_report(snap, Selector(), pod)
    if _output(args) == "json":
        return to_json("GPUTopologyPod", report)
    return pod_text(report, _output(args) == "wide")


if __name__ == "__main__":
    sys.exit(main())
