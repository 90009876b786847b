package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// FieldManager is the field manager of every server-side apply made here.
const FieldManager = "isthmus-tests"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ReadManifests decodes every object of the YAML files (multi-document, *.yaml
// and *.yml) in dir, sorted by file name. Empty documents are skipped.
func ReadManifests(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.y*ml"))
	if err != nil {
		return nil, fmt.Errorf("list manifests: %w", err)
	}
	sort.Strings(files)
	var objs []*unstructured.Unstructured
	for _, f := range files {
		o, err := ReadManifestFile(f)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// ReadManifestFile decodes every object of a multi-document YAML file.
func ReadManifestFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	return DecodeManifests(path, data)
}

// DecodeManifests decodes every object of multi-document YAML data, named
// path in errors. Empty documents are skipped.
func DecodeManifests(path string, data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read manifest %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("decode manifest %s, document %d: %w", path, i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("decode manifest %s, document %d: no kind or apiVersion", path, i+1)
		}
		objs = append(objs, u)
	}
}

// Kustomization renders a kustomization directory the simple way: the objects
// of every entry of its resources list (files, or directories that hold a
// kustomization.yaml of their own, recursively), with its namespace set on
// every namespaced object that has none. It supports no patches or
// generators, and fails when the kustomization uses a field it would ignore.
func Kustomization(dir string) ([]*unstructured.Unstructured, error) {
	path := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kustomization: %w", err)
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	namespace, _ := k["namespace"].(string)
	for field := range k {
		switch field {
		case "apiVersion", "kind", "resources", "namespace", "metadata", "images":
		default:
			return nil, fmt.Errorf("render %s: field %q is not supported by this renderer; extend testenv/kube.Kustomization", path, field)
		}
	}
	resources, _ := k["resources"].([]any)
	var objs []*unstructured.Unstructured
	for _, r := range resources {
		name, ok := r.(string)
		if !ok {
			return nil, fmt.Errorf("render %s: resource %v is not a path", path, r)
		}
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("render %s: resource %s: %w", path, name, err)
		}
		var o []*unstructured.Unstructured
		if st.IsDir() {
			o, err = Kustomization(p)
		} else {
			o, err = ReadManifestFile(p)
		}
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	images, _ := k["images"].([]any)
	for _, im := range images {
		m, _ := im.(map[string]any)
		if err := setImage(objs, m); err != nil {
			return nil, fmt.Errorf("render %s: %w", path, err)
		}
	}
	if namespace != "" {
		for _, o := range objs {
			if o.GetNamespace() == "" && !clusterScopedKind(o) {
				o.SetNamespace(namespace)
			}
		}
	}
	return objs, nil
}

// setImage applies one entry of a kustomization's images list (name, newName,
// newTag, digest) to every container and init container of every pod template.
func setImage(objs []*unstructured.Unstructured, im map[string]any) error {
	name, _ := im["name"].(string)
	if name == "" {
		return fmt.Errorf("images entry %v has no name", im)
	}
	newName, _ := im["newName"].(string)
	newTag, _ := im["newTag"].(string)
	digest, _ := im["digest"].(string)
	for _, o := range objs {
		for _, field := range []string{"containers", "initContainers"} {
			path := []string{"spec", "template", "spec", field}
			if o.GetKind() == "Pod" {
				path = []string{"spec", field}
			}
			cs, found, _ := unstructured.NestedSlice(o.Object, path...)
			if !found {
				continue
			}
			for _, c := range cs {
				cm, _ := c.(map[string]any)
				image, _ := cm["image"].(string)
				base, tag := image, ""
				if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
					base, tag = image[:i], image[i:]
				}
				if i := strings.Index(base, "@"); i >= 0 {
					base, tag = base[:i], base[i:]
				}
				if base != name {
					continue
				}
				if newName != "" {
					base = newName
				}
				switch {
				case digest != "":
					tag = "@" + digest
				case newTag != "":
					tag = ":" + newTag
				}
				cm["image"] = base + tag
			}
			if err := unstructured.SetNestedSlice(o.Object, cs, path...); err != nil {
				return fmt.Errorf("set image of %s %s: %w", o.GetKind(), o.GetName(), err)
			}
		}
	}
	return nil
}

// clusterScopedKind says which kinds kustomize leaves without a namespace.
func clusterScopedKind(o *unstructured.Unstructured) bool {
	switch o.GetKind() {
	case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
		"Node", "PersistentVolume", "StorageClass", "PriorityClass",
		"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "APIService",
		"Site", "SitePeering", "GatewayPool", "SiteGatewayPoolAssignment":
		return true
	}
	return false
}

// InstallCRDs applies (server-side) every CustomResourceDefinition in the YAML
// files of dir and waits until each is Established. It fails when dir holds
// none.
func (s *Server) InstallCRDs(ctx context.Context, dir string) error {
	objs, err := ReadManifests(dir)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(s.RESTConfig())
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	var names []string
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := apply(ctx, dyn.Resource(crdGVR), o, false); err != nil {
			return fmt.Errorf("install CRD %s: %w", o.GetName(), err)
		}
		names = append(names, o.GetName())
	}
	if len(names) == 0 {
		return fmt.Errorf("install CRDs: no CustomResourceDefinition in %s", dir)
	}
	for _, name := range names {
		if err := waitEstablished(ctx, dyn, name); err != nil {
			return err
		}
	}
	// Discovery must serve the new resources before clients can use them.
	return s.waitDiscovery(ctx, objs)
}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		crd, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for CRD %s to be Established: %w (last get: %v)", name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitDiscovery waits until discovery lists the kinds of the CRDs among objs.
func (s *Server) waitDiscovery(ctx context.Context, objs []*unstructured.Unstructured) error {
	dc, err := discovery.NewDiscoveryClientForConfig(s.RESTConfig())
	if err != nil {
		return fmt.Errorf("create discovery client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		plural, _, _ := unstructured.NestedString(o.Object, "spec", "names", "plural")
		versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
		for _, v := range versions {
			vm, _ := v.(map[string]any)
			if served, _ := vm["served"].(bool); !served {
				continue
			}
			gv := group + "/" + fmt.Sprint(vm["name"])
			for {
				list, err := dc.ServerResourcesForGroupVersion(gv)
				if err == nil && hasResource(list, plural) {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("wait for discovery of %s in %s: %w", plural, gv, ctx.Err())
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}
	return nil
}

func hasResource(list *metav1.APIResourceList, plural string) bool {
	for _, r := range list.APIResources {
		if r.Name == plural {
			return true
		}
	}
	return false
}

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// DryRun makes every apply a server-side dry run (DryRun=All): the API
	// server validates, defaults and admits the object (RBAC, admission) and
	// stores nothing.
	DryRun bool
}

// Apply applies each object with server-side apply, mapping its kind to a
// resource through discovery. It returns one error per object that failed,
// naming it, joined.
func (s *Server) Apply(ctx context.Context, objs []*unstructured.Unstructured, opts ApplyOptions) error {
	return ApplyTo(ctx, s.RESTConfig(), objs, opts)
}

// ApplyTo is Server.Apply on the API server cfg reaches, any cluster's.
func ApplyTo(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured, opts ApplyOptions) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	var errs []error
	for _, o := range objs {
		id := fmt.Sprintf("%s %s", o.GetKind(), o.GetName())
		if ns := o.GetNamespace(); ns != "" {
			id = fmt.Sprintf("%s %s/%s", o.GetKind(), ns, o.GetName())
		}
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: map kind: %w", id, err))
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			if o.GetNamespace() == "" {
				errs = append(errs, fmt.Errorf("%s: namespaced kind without a namespace", id))
				continue
			}
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		} else if o.GetNamespace() != "" {
			errs = append(errs, fmt.Errorf("%s: cluster-scoped kind with namespace %q", id, o.GetNamespace()))
			continue
		}
		if _, err := apply(ctx, ri, o, opts.DryRun); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

func apply(ctx context.Context, ri dynamic.ResourceInterface, o *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	data, err := o.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	po := metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTo(true)}
	if dryRun {
		po.DryRun = []string{metav1.DryRunAll}
	}
	return ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, po)
}

func ptrTo[T any](v T) *T { return &v }
