// Package ipamdtest holds what the tests of the IPAM server, the agent's CNI
// side and the plugin share: the objects of one Site and its node.
package ipamdtest

import "fmt"

// Objects is the YAML of Site "a" (nodeCidrs 172.16.1.0/24, pool blocks a
// YAML list such as "[10.10.0.0/16]", manageCniPlugin manage, tunnelMTU mtu,
// 0 for unset) and node "n1" (InternalIP 172.16.1.10) with podCIDR, or none
// when podCIDR is empty.
func Objects(blocks string, manage bool, mtu int, podCIDR string) string {
	spec := "{}"
	if podCIDR != "" {
		spec = fmt.Sprintf("{podCIDRs: [%s]}", podCIDR)
	}
	return fmt.Sprintf(`apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: a}
spec:
  nodeCidrs: [172.16.1.0/24]
  manageCniPlugin: %t
  tunnelMTU: %d
  podCidrAssignments:
    - cidrBlocks: %s
      nodeBlockSizes: {ipv4: 24}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
spec: %s
status: {addresses: [{type: InternalIP, address: 172.16.1.10}]}
`, manage, mtu, blocks, spec)
}
