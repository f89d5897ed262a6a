"""The Kubernetes scheduler extender (filter, prioritize, bind) built on `topology`."""
