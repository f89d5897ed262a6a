"""The Kubernetes edge: the API client behind one narrow interface (`client.KubeApi`), the Binding writer, the
list-and-watch reflector, leader election and the leader's label. Imports only `api` and `topology`."""
