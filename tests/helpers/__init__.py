"""What the tests share: the stand-ins (in-process API server, kubelet stand-in, fake NVML), the harnesses that wire
the extender and the node agent against them, and the checks and boards more than one suite uses."""
