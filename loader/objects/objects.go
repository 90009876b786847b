// Package objects reads isthmus objects (Site, SitePeering, GatewayPool,
// SiteGatewayPoolAssignment) and core v1 Nodes
// from multi-document YAML and validates them as a whole.
//
// Load is pure (file contents in, validated Set out) and LoadDir is its file
// system front end; Validate runs the same rules on objects that came from the
// Kubernetes API, without files. Every problem found is reported, not only the
// first, each naming the file (if any), the object and the field, so a user
// fixes everything in one pass. CIDR fields are normalized in place (10.0.2.5/23 becomes 10.0.2.0/23,
// with a Warning), so consumers of a Set can parse them without checking again.
package objects

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// Set is a validated collection of objects, each kind sorted by name.
//
// A Set returned by Load satisfies: names are unique per kind, every CIDR
// field is valid and canonical, every Node has an InternalIP inside the
// nodeCidrs of exactly one Site, no two Sites overlap, no two Nodes' podCIDRs
// overlap, every SitePeering names at least two existing Sites, every
// GatewayPool has a valid type and a valid, non-empty nodeSelector, and every
// SiteGatewayPoolAssignment names at least two existing Sites and existing
// pools with a gateway in each of its sites (one with an ExternalIP for an
// External pool).
type Set struct {
	Sites                      []v1alpha1.Site
	SitePeerings               []v1alpha1.SitePeering
	GatewayPools               []v1alpha1.GatewayPool
	SiteGatewayPoolAssignments []v1alpha1.SiteGatewayPoolAssignment
	Nodes                      []corev1.Node
	// Rejected are the objects set aside by LoadSettingAside or
	// ValidateSettingAside, in the order they were found; always empty in a
	// Set from Load or Validate, which fail instead.
	Rejected []Rejected
}

// Objects are Sites, SitePeerings, GatewayPools, SiteGatewayPoolAssignments
// and Nodes not yet validated, such as the contents of informer caches.
type Objects struct {
	Sites                      []v1alpha1.Site
	SitePeerings               []v1alpha1.SitePeering
	GatewayPools               []v1alpha1.GatewayPool
	SiteGatewayPoolAssignments []v1alpha1.SiteGatewayPoolAssignment
	Nodes                      []corev1.Node
}

// Warning is a problem that did not stop loading, such as a normalized prefix.
type Warning struct {
	// File is the base name of the file the object came from; empty for an
	// object from the API.
	File string `json:"file,omitempty"`
	// Object is the kind and name, such as `Site "flex-site"`.
	Object string `json:"object"`
	// Field is the path of the field, such as spec.nodeCidrs[0].
	Field   string `json:"field"`
	Message string `json:"message"`
}

// String formats the warning as "file: Object: field: message".
func (w Warning) String() string { return location(w.File, w.Object, w.Field, w.Message) }

// Error is one validation problem; Load and Validate join them with
// errors.Join (see Errors).
type Error struct {
	// File is the base name of the file the object came from; empty for an
	// object from the API.
	File string
	// Object is the kind and name, such as `Site "flex-site"`, or where in
	// its file an object without a name starts.
	Object string
	Field  string
	Msg    string
}

// Error formats the problem as "file: Object: field: message", leaving out
// empty parts.
func (e *Error) Error() string { return location(e.File, e.Object, e.Field, e.Msg) }

// KindName splits Object into the kind and the name, such as "Site" and
// "flex-site"; ok is false when the object has no name.
func (e *Error) KindName() (kind, name string, ok bool) {
	return splitLabel(e.Object)
}

// Errors returns the *Error values in err (as returned by Load or Validate),
// in order; nil for nil.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if e, ok := err.(*Error); ok {
			out = append(out, e)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// label is how messages name an object: `Kind "name"`.
func label(kind, name string) string { return kind + " " + strconv.Quote(name) }

func splitLabel(l string) (kind, name string, ok bool) {
	kind, quoted, found := strings.Cut(l, " ")
	if !found {
		return "", "", false
	}
	name, err := strconv.Unquote(quoted)
	if err != nil {
		return "", "", false
	}
	return kind, name, true
}

// inFile describes an object with the file it came from, if any.
func inFile(object, file string) string {
	if file == "" {
		return object
	}
	return object + " in " + file
}

func location(parts ...string) string {
	return strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), ": ")
}

// LoadDir reads every *.yaml and *.yml file directly in dir (sorted by name,
// not recursive) and loads them as one Set. Other files are ignored.
func LoadDir(dir string) (*Set, []Warning, error) {
	files, err := readDir(dir)
	if err != nil {
		return nil, nil, err
	}
	return Load(files)
}

// readDir reads the *.yaml and *.yml files directly in dir.
func readDir(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read objects directory: %w", err)
	}
	files := make(map[string][]byte)
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read objects file: %w", err)
		}
		files[e.Name()] = data
	}
	return files, nil
}

// Load decodes and validates the multi-document YAML in files (file name to
// contents; names only label messages and fix the order). On any error it
// returns a nil Set and every error found, joined; warnings are returned
// either way.
func Load(files map[string][]byte) (*Set, []Warning, error) {
	l := &loader{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		l.decodeFile(name, files[name])
	}
	return l.finish()
}

// Validate runs every rule of Load on objects that came from somewhere other
// than files, such as the Kubernetes API: the same checks, the same
// normalization, the same Set. Messages name the object and the field, such
// as `Site "flex-site": spec.nodeCidrs[1]: invalid CIDR "10.0.0.0/33"`. It
// does not modify in: the Set holds deep copies, so in may be shared (with an
// informer cache, say). Objects without a name are rejected, as in files.
func Validate(in Objects) (*Set, []Warning, error) {
	l := &loader{}
	l.addAll(in)
	return l.finish()
}

// addAll adds deep copies of the objects in, each kind in creation order
// (of a Node a Validator saw unchanged, the copy it made then).
func (l *loader) addAll(in Objects) {
	addEntries(l, &l.sites, v1alpha1.KindSite, in.Sites, func(o *v1alpha1.Site) *v1alpha1.Site { return o.DeepCopy() })
	addEntries(l, &l.peerings, v1alpha1.KindSitePeering, in.SitePeerings, func(o *v1alpha1.SitePeering) *v1alpha1.SitePeering { return o.DeepCopy() })
	addEntries(l, &l.pools, v1alpha1.KindGatewayPool, in.GatewayPools, func(o *v1alpha1.GatewayPool) *v1alpha1.GatewayPool { return o.DeepCopy() })
	addEntries(l, &l.assigns, v1alpha1.KindSiteGatewayPoolAssignment, in.SiteGatewayPoolAssignments, func(o *v1alpha1.SiteGatewayPoolAssignment) *v1alpha1.SiteGatewayPoolAssignment { return o.DeepCopy() })
	addEntries(l, &l.nodes, "Node", in.Nodes, l.copyNode)
}

// named is what addEntries needs of an object.
type named interface {
	GetName() string
	GetCreationTimestamp() metav1.Time
}

func addEntries[T any, PT interface {
	*T
	named
}](l *loader, dst *[]entry[T], kind string, objs []T, deepCopy func(*T) *T) {
	for i := range objs {
		name := PT(&objs[i]).GetName()
		if name == "" {
			l.errorf("", fmt.Sprintf("%s [%d]", kind, i), "metadata.name", "required")
			continue
		}
		*dst = append(*dst, entry[T]{deepCopy(&objs[i]), "", label(kind, name)})
	}
	// Objects from the API come in no particular order (an informer cache is a
	// map): sort them by creation, then by name, so the same objects always
	// give the same messages, and of two in conflict the later one is reported
	// (and set aside: the object created first wins).
	slices.SortStableFunc(*dst, func(a, b entry[T]) int {
		ta, tb := PT(a.obj).GetCreationTimestamp(), PT(b.obj).GetCreationTimestamp()
		if c := ta.Time.Compare(tb.Time); c != 0 {
			return c
		}
		return strings.Compare(a.label, b.label)
	})
}

// finish validates what the loader holds and builds the Set.
func (l *loader) finish() (*Set, []Warning, error) {
	l.validate()
	if len(l.errs) > 0 {
		return nil, l.warnings, errors.Join(l.errs...)
	}
	return l.build(), l.warnings, nil
}

// build makes the Set of what the loader holds.
func (l *loader) build() *Set {
	// Nodes preallocated: a Node value is large, and growing a slice of
	// 5,000 copies them over and over.
	set := &Set{}
	if len(l.nodes) > 0 {
		set.Nodes = make([]corev1.Node, 0, len(l.nodes))
	}
	for _, s := range l.sites {
		set.Sites = append(set.Sites, *s.obj)
	}
	for _, p := range l.peerings {
		set.SitePeerings = append(set.SitePeerings, *p.obj)
	}
	for _, p := range l.pools {
		set.GatewayPools = append(set.GatewayPools, *p.obj)
	}
	for _, a := range l.assigns {
		set.SiteGatewayPoolAssignments = append(set.SiteGatewayPoolAssignments, *a.obj)
	}
	// Sorted as pointers, then copied: sorting the Node values themselves
	// moved a large struct per swap.
	nodes := slices.Clone(l.nodes)
	slices.SortStableFunc(nodes, func(a, b entry[corev1.Node]) int { return strings.Compare(a.obj.Name, b.obj.Name) })
	for _, n := range nodes {
		set.Nodes = append(set.Nodes, *n.obj)
	}
	sortByName(set.Sites, func(s v1alpha1.Site) string { return s.Name })
	sortByName(set.SitePeerings, func(p v1alpha1.SitePeering) string { return p.Name })
	sortByName(set.GatewayPools, func(p v1alpha1.GatewayPool) string { return p.Name })
	sortByName(set.SiteGatewayPoolAssignments, func(a v1alpha1.SiteGatewayPoolAssignment) string { return a.Name })
	return set
}

func sortByName[T any](items []T, name func(T) string) {
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(name(a), name(b)) })
}

// Site returns the Site with the given name, or nil.
func (s *Set) Site(name string) *v1alpha1.Site { return s.lookup().sites[name] }

// Node returns the Node with the given name, or nil.
func (s *Set) Node(name string) *corev1.Node { return s.lookup().nodes[name] }

// SiteOf returns the Site whose nodeCidrs hold the node's InternalIP, or nil
// when there is none. In a Set from Load there is exactly one. node is
// usually one of the Set's own Nodes (looked up in its index); any other is
// matched against the Sites.
func (s *Set) SiteOf(node *corev1.Node) *v1alpha1.Site {
	ix := s.lookup()
	if site, ok := ix.siteOf[node]; ok {
		return site
	}
	if ix.nodes[node.Name] == node {
		return nil // one of ours, in no Site
	}
	ip, ok := InternalIP(node)
	if !ok {
		return nil
	}
	for i := range s.Sites {
		if siteHolds(&s.Sites[i], ip) {
			return &s.Sites[i]
		}
	}
	return nil
}

// NodesOf returns the Nodes of the named Site, sorted by name. The slice is
// shared: do not modify it.
func (s *Set) NodesOf(site string) []*corev1.Node { return s.lookup().nodesOf[site] }

// WithoutUnsitedNodes returns in without the Nodes that belong to no Site (no
// InternalIP, or an InternalIP in no Site's nodeCidrs), with a Warning for
// each. In a cluster such nodes are simply not part of isthmus (a control
// plane node, a node that joined before its Site was created); in a file they
// are a mistake, so Load and Validate reject them. in is not modified.
func (in Objects) WithoutUnsitedNodes() (Objects, []Warning) {
	out := in
	out.Nodes = make([]corev1.Node, 0, len(in.Nodes))
	var warns []Warning
	for i := range in.Nodes {
		n := &in.Nodes[i]
		ip, ok := InternalIP(n)
		if !ok {
			warns = append(warns, Warning{Object: label("Node", n.Name), Field: "status.addresses", Message: "no InternalIP yet: left out"})
			continue
		}
		if !slices.ContainsFunc(in.Sites, func(s v1alpha1.Site) bool { return siteHolds(&s, ip) }) {
			warns = append(warns, Warning{Object: label("Node", n.Name), Field: "status.addresses",
				Message: fmt.Sprintf("InternalIP %s is in no Site's spec.nodeCidrs: left out", ip)})
			continue
		}
		out.Nodes = append(out.Nodes, *n)
	}
	return out, warns
}

// SiteEncrypted reports whether a SitePeering or SiteGatewayPoolAssignment with
// encryption WireGuard joins site to another: its tunnels to other sites, or its
// gateways', run inside WireGuard.
func (s *Set) SiteEncrypted(site string) bool {
	for i := range s.SitePeerings {
		if sp := &s.SitePeerings[i]; sp.Spec.Encrypts() && slices.Contains(sp.Spec.Sites, site) {
			return true
		}
	}
	for i := range s.SiteGatewayPoolAssignments {
		if a := &s.SiteGatewayPoolAssignments[i]; a.Spec.Encrypts() && slices.Contains(a.Spec.Sites, site) {
			return true
		}
	}
	return false
}
