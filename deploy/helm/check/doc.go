// Package check holds the offline checks of the Helm chart (deploy/helm/kafka-delay), run by
// `make test`: the chart linted as `helm lint` does, rendered with each shipped values file as
// `helm template` does, and every rendered object decoded strictly (unknown fields are errors)
// into its Kubernetes API type, then checked for what the chart promises. Nothing here talks to
// a cluster.
package check
