//go:build tools

// Package critools pins sigs.k8s.io/cri-tools for `go build
// sigs.k8s.io/cri-tools/cmd/crictl` in this module (testenv/kube/kubebin).
package critools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
