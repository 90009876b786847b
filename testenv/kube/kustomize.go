package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Kustomize renders a kustomization directory with the kustomize library
// kubectl builds in (sigs.k8s.io/kustomize/api, at the version k8s.io/kubectl
// of the API server's release requires) and kubectl's options, so the objects
// are those `kubectl apply -k dir` sends: patches, images and bases included.
// Kustomization, the simple renderer, stays for the manifest tests that must
// not depend on kustomize.
func Kustomize(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		// Through JSON, as kubectl sends it: the map kyaml gives holds Go
		// ints, which unstructured's deep copies refuse.
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize %s: %s: %w", dir, r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("kustomize %s: %s: %w", dir, r.CurId(), err)
		}
		objs = append(objs, u)
	}
	return objs, nil
}
