package kube

import (
	"context"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// Binaries returns a kube-apiserver and an etcd, built once into a cache; see
// kubebin.Binaries, which Start calls.
func Binaries(ctx context.Context) (apiserver, etcd string, err error) {
	return kubebin.Binaries(ctx)
}

// KubeProxy returns a kube-proxy of the same release as Binaries'
// kube-apiserver, from the same cache; see kubebin.KubeProxy.
func KubeProxy(ctx context.Context) (string, error) {
	return kubebin.KubeProxy(ctx)
}
