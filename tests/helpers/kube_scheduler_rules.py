"""kube-scheduler's own validation of a KubeSchedulerConfiguration, re-implemented: the errors it would refuse to
start with (`kube_scheduler_errors`), after its defaults, with the name and duration rules it applies.

A KubeSchedulerConfiguration is not an API object and has no schema in kubernetes-validate. Used by
tests/manifests/test_manifests.py (the shipped configurations and broken variants of them) and
tests/e2e/test_harness.py (the configurations the end-to-end harness derives from them).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from helpers.manifest_checks import Doc

# ---------------------------------------------------------------------------------------------------------------
# KubeSchedulerConfiguration: kube-scheduler's own rules
#
# Read from kubernetes/kubernetes:
#   pkg/scheduler/apis/config/scheme/scheme.go
#       Codecs = serializer.NewCodecFactory(Scheme, serializer.EnableStrict)
#   pkg/scheduler/apis/config/v1/defaults.go (run before validation)
#       SetDefaults_KubeSchedulerConfiguration, SetDefaults_NodeResourcesFitArgs,
#       SetDefaults_NodeResourcesBalancedAllocationArgs
#   pkg/scheduler/apis/config/validation/validation.go
#       ValidateKubeSchedulerConfiguration, validatePercentageOfNodesToScore, validateKubeSchedulerProfile,
#       validatePluginConfig, validateCommonQueueSort, validateExtenders, validateExtendedResourceName
#   pkg/scheduler/apis/config/validation/validation_pluginargs.go
#       ValidateNodeResourcesFitArgs, validateResources, ValidateNodeResourcesBalancedAllocationArgs
#   pkg/scheduler/framework/plugins/noderesources/fit.go   NewFit (validates its args when the plugin is built)
#   pkg/scheduler/framework/plugins/registry.go           NewInTreeRegistry (plugin names)
#   component-base/config/validation                      ValidateLeaderElectionConfiguration,
#                                                         ValidateClientConnectionConfiguration
#   apimachinery/pkg/util/validation/validation.go        IsQualifiedName, IsDNS1123Subdomain
#   pkg/apis/core/v1/helper/helpers.go                    IsExtendedResourceName, IsNativeResource
#   staging/src/k8s.io/kube-scheduler/config/v1/types.go  the fields that exist (for strict decoding)
# ---------------------------------------------------------------------------------------------------------------

DURATION = "duration"  # a metav1.Duration: a string that time.ParseDuration accepts
ANY = "any"

_PLUGIN = {"name": str, "weight": int}
_PLUGIN_SET = {"enabled": [_PLUGIN], "disabled": [_PLUGIN]}
_EXTENSION_POINTS = (
    "preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
    "reserve", "permit", "preBind", "bind", "postBind", "multiPoint",
)
_RESOURCE_SPEC = {"name": str, "weight": int}
_PLUGIN_ARGS_SHAPES: dict[str, dict[str, Any]] = {
    "NodeResourcesFit": {
        "apiVersion": str,
        "kind": str,
        "ignoredResources": [str],
        "ignoredResourceGroups": [str],
        "scoringStrategy": {
            "type": str,
            "resources": [_RESOURCE_SPEC],
            "requestedToCapacityRatio": {"shape": [{"utilization": int, "score": int}]},
        },
    },
    "NodeResourcesBalancedAllocation": {"apiVersion": str, "kind": str, "resources": [_RESOURCE_SPEC]},
}
KUBE_SCHEDULER_CONFIGURATION_SHAPE: dict[str, Any] = {
    "apiVersion": str,
    "kind": str,
    "parallelism": int,
    "leaderElection": {
        "leaderElect": bool,
        "leaseDuration": DURATION,
        "renewDeadline": DURATION,
        "retryPeriod": DURATION,
        "resourceLock": str,
        "resourceName": str,
        "resourceNamespace": str,
    },
    "clientConnection": {
        "kubeconfig": str, "acceptContentTypes": str, "contentType": str, "qps": float, "burst": int,
    },
    "enableProfiling": bool,
    "enableContentionProfiling": bool,
    "percentageOfNodesToScore": int,
    "podInitialBackoffSeconds": int,
    "podMaxBackoffSeconds": int,
    "profiles": [
        {
            "schedulerName": str,
            "percentageOfNodesToScore": int,
            "plugins": {point: _PLUGIN_SET for point in _EXTENSION_POINTS},
            "pluginConfig": [{"name": str, "args": ANY}],
        }
    ],
    "extenders": [
        {
            "urlPrefix": str,
            "filterVerb": str,
            "preemptVerb": str,
            "prioritizeVerb": str,
            "weight": int,
            "bindVerb": str,
            "enableHTTPS": bool,
            "tlsConfig": {
                "insecure": bool, "serverName": str, "certFile": str, "keyFile": str, "caFile": str,
                "certData": str, "keyData": str, "caData": str,
            },
            "httpTimeout": DURATION,
            "nodeCacheCapable": bool,
            "managedResources": [{"name": str, "ignoredByScheduler": bool}],
            "ignorable": bool,
        }
    ],
    "delayCacheUntilActive": bool,
}

# NewInTreeRegistry's stable plugins (feature-gated newcomers left out on purpose: not for this profile).
IN_TREE_PLUGINS = frozenset({
    "PrioritySort", "SchedulingGates", "NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity",
    "NodePorts", "NodeResourcesFit", "VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone",
    "PodTopologySpread", "InterPodAffinity", "DefaultPreemption", "NodeResourcesBalancedAllocation",
    "ImageLocality", "DefaultBinder", "DynamicResources",
})

_GO_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Seconds, as Go's time.ParseDuration reads "3s", "1m30s", "-5s", "0" (metav1.Duration uses it)."""
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text[1:] if text[:1] == "+" else text)
    if body == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(body):
        part = _GO_DURATION_PART.match(body, pos)
        if part is None:
            raise ValueError(f'time: invalid duration "{text}"')
        total += float(part[1]) * _GO_DURATION_UNIT[part[2]]
        pos = part.end()
    if pos == 0:
        raise ValueError(f'time: invalid duration "{text}"')
    return sign * total


def shape_errors(value: Any, shape: Any, path: str) -> list[str]:
    """Strict decoding: an unknown field, or a value of the wrong type, is an error."""
    if shape is ANY:
        return []
    if shape is DURATION:
        if not isinstance(value, str):
            return [f"{path}: strict decoding error: a duration must be a string like \"3s\""]
        try:
            parse_go_duration(value)
        except ValueError as error:
            return [f"{path}: {error}"]
        return []
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{path}: strict decoding error: expected an object"]
        errors = []
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key not in shape:
                errors.append(f'{child}: strict decoding error: unknown field "{key}"')
            else:
                errors += shape_errors(item, shape[key], child)
        return errors
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{path}: strict decoding error: expected a list"]
        return [e for i, item in enumerate(value) for e in shape_errors(item, shape[0], f"{path}[{i}]")]
    if shape is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, shape)
    return [] if ok else [f"{path}: strict decoding error: expected {shape.__name__}, got {value!r}"]


# apimachinery/pkg/util/validation/validation.go
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _length_and_format(value: str, max_length: int, pattern: re.Pattern[str], format_message: str) -> list[str]:
    errors = [f"must be no more than {max_length} characters"] if len(value) > max_length else []
    return errors if pattern.fullmatch(value) else [*errors, format_message]


def is_dns1123_subdomain(value: str) -> list[str]:
    return _length_and_format(value, 253, _DNS1123_SUBDOMAIN, "a lowercase RFC 1123 subdomain must consist of lower "
                              "case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                              "character")


def is_qualified_name(value: str) -> list[str]:
    """IsQualifiedName: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
    errors: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {message}" for message in is_dns1123_subdomain(prefix)]
    else:
        return [("a qualified name must consist of alphanumeric characters, '-', '_' or '.', with an optional "
                 "DNS subdomain prefix and '/'")]
    if not name:
        errors.append("name part must be non-empty")
    return errors + [f"name part {message}" for message in _length_and_format(
        name, 63, _QUALIFIED_NAME,
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
        "character")]


def is_native_resource(name: str) -> bool:
    # IsNativeResource: `!strings.Contains(string(name), "/") || IsPrefixedNativeResource(name)`, the latter
    # being `strings.Contains(string(name), v1.ResourceDefaultNamespacePrefix)` ("kubernetes.io/").
    return "/" not in name or "kubernetes.io/" in name


def is_extended_resource_name(name: str) -> bool:
    # IsExtendedResourceName: `if IsNativeResource(name) || strings.HasPrefix(string(name),
    # v1.DefaultResourceRequestsPrefix) { return false }`; then "requests." + name must be a qualified name.
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return not is_qualified_name("requests." + name)


def validate_extended_resource_name(path: str, name: str) -> list[str]:
    # validateExtendedResourceName: `for _, msg := range validation.IsQualifiedName(string(name)) {...}` and,
    # if that passed, `if !v1helper.IsExtendedResourceName(name) { ... "is an invalid extended resource name" }`.
    errors = [f"{path}: Invalid value: {name!r}: {message}" for message in is_qualified_name(name)]
    if errors:
        return errors
    if not is_extended_resource_name(name):
        return [f"{path}: Invalid value: {name!r}: is an invalid extended resource name"]
    return []


# defaults.go: `defaultResourceSpec` is cpu and memory, weight 1 each.
DEFAULT_RESOURCE_SPEC = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]


def with_defaults(config: Doc) -> Doc:
    """What SetDefaults_KubeSchedulerConfiguration (and the plugin-args defaulters) fill in before validation."""
    config = copy.deepcopy(config)
    config.setdefault("parallelism", 16)
    # `if len(obj.Profiles) == 0 { obj.Profiles = append(obj.Profiles, configv1.KubeSchedulerProfile{}) }`
    profiles = config.setdefault("profiles", []) or [{}]
    config["profiles"] = profiles
    # `if len(obj.Profiles) == 1 && obj.Profiles[0].SchedulerName == nil { ... v1.DefaultSchedulerName }`
    if len(profiles) == 1 and "schedulerName" not in profiles[0]:
        profiles[0]["schedulerName"] = "default-scheduler"
    election = config.setdefault("leaderElection", {})
    election.setdefault("leaderElect", True)  # RecommendedDefaultLeaderElectionConfiguration
    election.setdefault("resourceLock", "leases")
    election.setdefault("resourceNamespace", "kube-system")
    election.setdefault("resourceName", "kube-scheduler")
    election.setdefault("leaseDuration", "15s")
    election.setdefault("renewDeadline", "10s")
    election.setdefault("retryPeriod", "2s")
    config.setdefault("podInitialBackoffSeconds", 1)
    config.setdefault("podMaxBackoffSeconds", 10)
    for profile in profiles:
        for plugin_config in profile.get("pluginConfig", []):
            args = plugin_config.get("args") or {}
            if plugin_config.get("name") == "NodeResourcesFit":
                # SetDefaults_NodeResourcesFitArgs: LeastAllocated over cpu and memory when no strategy is
                # given, cpu and memory when no resources are, and "Weight == 0 → 1".
                strategy = args.setdefault("scoringStrategy", {"type": "LeastAllocated"})
                strategy["resources"] = strategy.get("resources") or copy.deepcopy(DEFAULT_RESOURCE_SPEC)
                for resource in strategy["resources"]:
                    if not resource.get("weight"):
                        resource["weight"] = 1
            if plugin_config.get("name") == "NodeResourcesBalancedAllocation":
                # SetDefaults_NodeResourcesBalancedAllocationArgs: cpu and memory; weight 0 becomes 1.
                args["resources"] = args.get("resources") or copy.deepcopy(DEFAULT_RESOURCE_SPEC)
                for resource in args["resources"]:
                    if not resource.get("weight"):
                        resource["weight"] = 1
            plugin_config["args"] = args
    return config


def plugin_set(profile: Doc, point: str) -> Doc:
    return (profile.get("plugins") or {}).get(point) or {}


def node_resources_fit_errors(path: str, args: Doc) -> list[str]:
    errors = []
    # ValidateNodeResourcesFitArgs: ignoredResources are label names; ignoredResourceGroups have no '/'.
    for i, resource in enumerate(args.get("ignoredResources", [])):
        errors += [f"{path}.ignoredResources[{i}]: {m}" for m in is_qualified_name(resource)]
    for i, group in enumerate(args.get("ignoredResourceGroups", [])):
        if "/" in group:
            errors.append(f"{path}.ignoredResourceGroups[{i}]: resource group name can't contain '/'")
    strategy = args.get("scoringStrategy")
    if strategy is not None:
        # `if !supportedScoringStrategyTypes.Has(string(args.ScoringStrategy.Type)) { field.NotSupported(...) }`
        if strategy.get("type") not in {"LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"}:
            errors.append(f"{path}.scoringStrategy.type: Unsupported value: {strategy.get('type')!r}")
        # validateResources: `if resource.Weight <= 0 || resource.Weight > 100 { "resource weight of %v not in
        # valid range (0, 100]" }`
        for i, resource in enumerate(strategy.get("resources", [])):
            if not 0 < resource["weight"] <= 100:
                errors.append(f"{path}.scoringStrategy.resources[{i}].weight: Invalid value: {resource['weight']}: "
                              f"resource weight of {resource['name']} not in valid range (0, 100]")
        # validateFunctionShape (RequestedToCapacityRatio): at least one point, utilization increasing.
        ratio = strategy.get("requestedToCapacityRatio")
        if ratio is not None:
            shape = ratio.get("shape", [])
            if not shape:
                errors.append(f"{path}.scoringStrategy.shape: Required value: at least one point must be specified")
            utilizations = [point["utilization"] for point in shape]
            if utilizations != sorted(set(utilizations)):
                errors.append(f"{path}.scoringStrategy.shape: values must be sorted in increasing order")
    return errors


def balanced_allocation_errors(path: str, args: Doc) -> list[str]:
    # ValidateNodeResourcesBalancedAllocationArgs: no duplicate resource; `if resource.Weight != 1 { "must be 1" }`.
    errors, seen = [], set()
    for i, resource in enumerate(args.get("resources", [])):
        if resource["name"] in seen:
            errors.append(f"{path}.resources[{i}].name: Duplicate value: {resource['name']!r}")
        seen.add(resource["name"])
        if resource["weight"] != 1:
            errors.append(f"{path}.resources[{i}].weight: Invalid value: {resource['weight']}: must be 1")
    return errors


def kube_scheduler_errors(raw: Doc) -> list[str]:
    """The errors kube-scheduler would refuse to start with, for one KubeSchedulerConfiguration document."""
    if raw.get("apiVersion") != "kubescheduler.config.k8s.io/v1" or raw.get("kind") != "KubeSchedulerConfiguration":
        # The scheme registers v1 only (v1beta2 and v1beta3 are gone by 1.36).
        return [f"no kind {raw.get('kind')!r} is registered for version {raw.get('apiVersion')!r}"]
    # scheme.go: the codec factory is built with serializer.EnableStrict, so unknown fields fail loading.
    errors = shape_errors(raw, KUBE_SCHEDULER_CONFIGURATION_SHAPE, "")
    for p, profile in enumerate(raw.get("profiles") or []):
        for c, plugin_config in enumerate(profile.get("pluginConfig") or []):
            shape = _PLUGIN_ARGS_SHAPES.get(plugin_config.get("name"))
            if shape is not None:
                errors += shape_errors(plugin_config.get("args") or {}, shape, f"profiles[{p}].pluginConfig[{c}].args")
    if errors:
        return errors
    config = with_defaults(raw)

    # ValidateKubeSchedulerConfiguration
    if config["parallelism"] <= 0:  # "should be an integer value greater than zero"
        errors.append(f"parallelism: Invalid value: {config['parallelism']}: "
                      "should be an integer value greater than zero")
    # ValidateClientConnectionConfiguration: `if cc.Burst < 0 { "must be non-negative" }`
    if config.get("clientConnection", {}).get("burst", 0) < 0:
        errors.append("clientConnection.burst: Invalid value: must be non-negative")
    election = config["leaderElection"]
    if election["leaderElect"]:
        # `if cc.LeaderElection.LeaderElect && cc.LeaderElection.ResourceLock != "leases" {
        #     ... `resourceLock value must be "leases"` }`
        if election["resourceLock"] != "leases":
            errors.append(f'leaderElection.resourceLock: Invalid value: {election["resourceLock"]!r}: '
                          'resourceLock value must be "leases"')
        # ValidateLeaderElectionConfiguration: durations > 0, leaseDuration > renewDeadline, names required.
        lease, renew, retry = (parse_go_duration(election[key])
                               for key in ("leaseDuration", "renewDeadline", "retryPeriod"))
        for key, seconds in (("leaseDuration", lease), ("renewDeadline", renew), ("retryPeriod", retry)):
            if seconds <= 0:
                errors.append(f"leaderElection.{key}: Invalid value: must be greater than zero")
        if lease <= renew:
            errors.append("leaderElection.leaseDuration: Invalid value: "
                          "LeaseDuration must be greater than RenewDeadline")
        for key in ("resourceLock", "resourceName", "resourceNamespace"):
            if not election[key]:
                errors.append(f"leaderElection.{key}: Invalid value: {key} is required")

    # validatePercentageOfNodesToScore: `if *percentageOfNodesToScore < 0 || *percentageOfNodesToScore > 100 {
    #     "not in valid range [0-100]" }`, for the global value and each profile's.
    def percentage(path: str, value: int | None) -> None:
        if value is not None and not 0 <= value <= 100:
            errors.append(f"{path}: Invalid value: {value}: not in valid range [0-100]")

    percentage("percentageOfNodesToScore", config.get("percentageOfNodesToScore"))
    # `if cc.PodInitialBackoffSeconds <= 0 { "must be greater than 0" }`
    if config["podInitialBackoffSeconds"] <= 0:
        errors.append("podInitialBackoffSeconds: Invalid value: must be greater than 0")
    # `if cc.PodMaxBackoffSeconds < cc.PodInitialBackoffSeconds { "must be greater than or equal to
    #     PodInitialBackoffSeconds" }`
    if config["podMaxBackoffSeconds"] < config["podInitialBackoffSeconds"]:
        errors.append("podMaxBackoffSeconds: Invalid value: must be greater than or equal to PodInitialBackoffSeconds")

    seen_names: dict[str, int] = {}
    for p, profile in enumerate(config["profiles"]):
        path = f"profiles[{p}]"
        name = profile.get("schedulerName") or ""
        # validateKubeSchedulerProfile: `if len(profile.SchedulerName) == 0 { field.Required(...) }`
        if not name:
            errors.append(f"{path}.schedulerName: Required value")
        # `if idx, ok := existingProfiles[profile.SchedulerName]; ok { field.Duplicate(...) }`
        elif name in seen_names:
            errors.append(f"{path}.schedulerName: Duplicate value: {name!r}")
        seen_names.setdefault(name, p)
        percentage(f"{path}.percentageOfNodesToScore", profile.get("percentageOfNodesToScore"))
        # runtime.NewFramework: an enabled plugin must be registered ("plugin %q does not exist").
        for point in _EXTENSION_POINTS:
            for i, plugin in enumerate(plugin_set(profile, point).get("enabled", [])):
                if plugin["name"] not in IN_TREE_PLUGINS:
                    errors.append(f"{path}.plugins.{point}.enabled[{i}]: plugin {plugin['name']!r} does not exist")
        # validatePluginConfig: `if seenPluginConfig.Has(name) { field.Duplicate(pluginConfigPath, name) }`,
        # then the known plugins' args validators.
        seen_config: set[str] = set()
        for c, plugin_config in enumerate(profile.get("pluginConfig", [])):
            config_path = f"{path}.pluginConfig[{c}]"
            if plugin_config["name"] in seen_config:
                errors.append(f"{config_path}: Duplicate value: {plugin_config['name']!r}")
            seen_config.add(plugin_config["name"])
            if plugin_config["name"] == "NodeResourcesFit":  # validated by NewFit when the plugin is built
                errors += node_resources_fit_errors(f"{config_path}.args", plugin_config["args"])
            if plugin_config["name"] == "NodeResourcesBalancedAllocation":
                errors += balanced_allocation_errors(f"{config_path}.args", plugin_config["args"])
    # validateCommonQueueSort: "only one queue sort plugin can be enabled", and it "has to match for all profiles".
    queue_sorts = [plugin_set(profile, "queueSort") for profile in config["profiles"]]
    if len(queue_sorts[0].get("enabled", [])) > 1:
        errors.append("profiles[0].plugins.queueSort.Enabled: Invalid value: only one queue sort plugin can be enabled")
    for p, queue_sort in enumerate(queue_sorts[1:], start=1):
        if queue_sort != queue_sorts[0]:
            errors.append(f"profiles[{p}].plugins.queueSort: Invalid value: "
                          "queueSort must be the same for all profiles")

    # validateExtenders
    binders = 0
    managed: set[str] = set()
    for i, extender in enumerate(config.get("extenders", [])):
        path = f"extenders[{i}]"
        # `if len(extender.PrioritizeVerb) > 0 && extender.Weight <= 0 {
        #     field.Invalid(path.Child("weight"), extender.Weight, "must have a positive weight applied to it") }`
        if extender.get("prioritizeVerb") and extender.get("weight", 0) <= 0:
            errors.append(f"{path}.weight: Invalid value: {extender.get('weight', 0)}: "
                          "must have a positive weight applied to it")
        # `if extender.BindVerb != "" { binders++ }`
        if extender.get("bindVerb"):
            binders += 1
        for j, resource in enumerate(extender.get("managedResources", [])):
            resource_path = f"{path}.managedResources[{j}].name"
            # `validationErrors := validateExtendedResourceName(managedResourcesPath.Child("name"), ...)`
            errors += validate_extended_resource_name(resource_path, resource["name"])
            # `if extenderManagedResources.Has(resource.Name) { ... "duplicate extender managed resource name" }`
            if resource["name"] in managed:
                errors.append(f"{resource_path}: Invalid value: {resource['name']!r}: "
                              "duplicate extender managed resource name")
            managed.add(resource["name"])
    # `if binders > 1 { field.Invalid(fldPath, fmt.Sprintf("found %d extenders implementing bind", binders),
    #     "only one extender can implement bind") }`
    if binders > 1:
        errors.append(f"extenders: Invalid value: found {binders} extenders implementing bind: "
                      "only one extender can implement bind")
    return errors
