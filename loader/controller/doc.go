// Package controller is the isthmus controller: it labels each Node with its
// Site (isthmus.dev/site), assigns Node podCIDRs from the Sites'
// podCidrAssignments, gives nodes without an IPv4 podCIDR a tunnel address
// (the isthmus.dev/tunnel-ipv4 annotation), and writes Site status
// conditions (Ready, PoolExhausted, Invalid).
//
// It is built the way the rest of isthmus is: informers on Nodes and Sites
// feed a work queue; Decide, a pure function of the Sites and Nodes, returns
// only the differences from what the cluster holds; the reconciler applies
// them with patches and status updates. Run adds leader election, so several
// replicas can run and one acts.
//
// # RBAC
//
// The controller needs exactly these permissions (deploy/ grants them):
//
//	ClusterRole:
//	  apiGroups: [""]                   resources: [nodes]         verbs: [list, watch, patch]
//	  apiGroups: [isthmus.dev]          resources: [sites]         verbs: [list, watch]
//	  apiGroups: [isthmus.dev]          resources: [sites/status]  verbs: [update]
//	Role in --namespace (only with leader election):
//	  apiGroups: [coordination.k8s.io]  resources: [leases]        verbs: [get, create, update]
//
// Nothing else: no get on nodes (the informer cache serves reads), no
// events (leader election runs without an event recorder), no create or
// delete of anything but the Lease.
//
// Node patches are JSON merge patches of metadata.labels,
// metadata.annotations, and spec.podCIDR/spec.podCIDRs (only on nodes that
// have no podCIDR: the API server refuses to change a set one, and the
// controller never tries).
package controller
