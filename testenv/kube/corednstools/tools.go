//go:build tools

// Package corednstools pins github.com/coredns/coredns for `go build
// github.com/coredns/coredns` in this module (testenv/kube/kubebin).
package corednstools

import _ "github.com/coredns/coredns"
