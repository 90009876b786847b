package v1alpha1

// Regenerate zz_generated.deepcopy.go and the CRDs in deploy/crds with
// `go generate ./api/v1alpha1` from the module root; the output is committed
// and must reproduce byte for byte.
//go:generate go tool controller-gen object:headerFile=boilerplate.go.txt paths=.
//go:generate go tool controller-gen crd paths=. output:crd:dir=../../deploy/crds
