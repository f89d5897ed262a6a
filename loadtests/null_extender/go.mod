module gpu-topology-extender/loadtests/null_extender

go 1.21
