"""`kubectl gputopo`: reads the cluster through the API server into the extender's own cluster state, and shows
it (`snapshot` reads, `views` computes, `render` lays out, `plugin` is the command). Imports `cache`, `kube`,
`api` and `topology`; it decides nothing."""
