"""Pinned DRA claims (issue 30, C1): at a pod's creation the admission webhook names the claims of its templates
(`admission`); the planner chooses the node and GPUs (`choice`, `node_fit`) and makes each claim with a selector on
their UUIDs (`planner`), so kube-scheduler, the one writer of status.allocation, allocates exactly those.
Imports `verbs` and below; `server` routes the webhook here, `cli` runs the planner."""
