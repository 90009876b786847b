package objects

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// Rejected is an object that validation set aside, with every reason.
type Rejected struct {
	// File is the base name of the file the object came from; empty for an
	// object from the API.
	File string
	// Object is the kind and name, such as `Node "flex-3"`, or where in its
	// file an object without a name starts.
	Object  string
	Reasons []*Error
}

// KindName splits Object into the kind and the name; ok is false when the
// object has no name.
func (r Rejected) KindName() (kind, name string, ok bool) { return splitLabel(r.Object) }

// String formats every reason on one line, separated by "; ".
func (r Rejected) String() string {
	msgs := make([]string, len(r.Reasons))
	for i, e := range r.Reasons {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Rejection returns the reasons the object called label (`Kind "name"`) was
// set aside, or nil when it was not.
func (s *Set) Rejection(label string) *Rejected {
	for i := range s.Rejected {
		if s.Rejected[i].Object == label {
			return &s.Rejected[i]
		}
	}
	return nil
}

// Label is how Rejected and Error name an object: `Kind "name"`.
func Label(kind, name string) string { return label(kind, name) }

// LoadDirSettingAside is LoadDir that sets invalid objects aside (see
// ValidateSettingAside) instead of failing. Only reading the directory can
// fail.
func LoadDirSettingAside(dir string) (*Set, []Warning, error) {
	return Rules{}.LoadDirSettingAside(dir)
}

// Rules are the cluster's settings that validation checks objects against,
// beyond the objects themselves. The zero Rules checks nothing more.
type Rules struct {
	// TunnelCIDR, when valid, is where tunnel addresses are allocated (the
	// controller's --tunnel-cidr): a Node whose isthmus.dev/tunnel-ipv4
	// annotation lies outside it is set aside, so a node cannot claim an
	// address the network does not route to tunnels, or one a pod or
	// another network holds. A tunnel address that is the first address of
	// the node's podCIDR (no annotation) is not checked against it.
	TunnelCIDR netip.Prefix
}

// LoadDirSettingAside is the package function LoadDirSettingAside, with r.
func (r Rules) LoadDirSettingAside(dir string) (*Set, []Warning, error) {
	files, err := readDir(dir)
	if err != nil {
		return nil, nil, err
	}
	set, warns := r.loadSettingAside(files)
	return set, warns, nil
}

// ValidateSettingAside is the package function ValidateSettingAside, with r.
func (r Rules) ValidateSettingAside(in Objects) (*Set, []Warning) {
	l := &loader{rules: r}
	l.addAll(in)
	return l.finishSettingAside()
}

// LoadSettingAside is Load that sets invalid objects aside instead of
// failing: see ValidateSettingAside. Objects are ordered by file name, then
// by their place in the file, so of two conflicting objects the one written
// first stays.
func LoadSettingAside(files map[string][]byte) (*Set, []Warning) {
	return Rules{}.loadSettingAside(files)
}

func (r Rules) loadSettingAside(files map[string][]byte) (*Set, []Warning) {
	l := &loader{rules: r}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		l.decodeFile(name, files[name])
	}
	return l.finishSettingAside()
}

// ValidateSettingAside runs the rules of Validate, but an object that breaks
// one is set aside (in Set.Rejected, with every reason) and everything else
// goes on: one bad object never stops the rest. Of two objects in conflict
// (overlapping prefixes, the same tunnel address) the one created first
// stays (metadata.creationTimestamp, ties broken by name) and the other is
// set aside. Setting an object aside may break others (a Site's Nodes, the
// peerings naming it): those are set aside too, with their own reasons, until
// what is left is valid. The Set satisfies every promise of a Set from Load.
func ValidateSettingAside(in Objects) (*Set, []Warning) {
	return Rules{}.ValidateSettingAside(in)
}

// finishSettingAside validates what the loader holds, setting aside objects
// until the rest passes, and builds the Set.
func (l *loader) finishSettingAside() (*Set, []Warning) {
	var rejected []Rejected
	// Decoding problems (an unnamed object, a document that does not parse)
	// concern objects that never made it into the loader.
	for _, e := range l.errs {
		rejected = addReason(rejected, e.(*Error))
	}
	l.errs = nil
	rejected = append(rejected, dropDuplicates(&l.sites)...)
	rejected = append(rejected, dropDuplicates(&l.peerings)...)
	rejected = append(rejected, dropDuplicates(&l.pools)...)
	rejected = append(rejected, dropDuplicates(&l.assigns)...)
	rejected = append(rejected, dropDuplicates(&l.nodes)...)

	var warnings []Warning
	for pass := 0; ; pass++ {
		l.warnings = nil
		l.validate()
		if pass == 0 {
			// Later passes run on what is left, already normalized: their
			// warnings repeat the first pass's.
			warnings = l.warnings
		}
		if len(l.errs) == 0 {
			break
		}
		bad := make(map[string]bool)
		for _, err := range l.errs {
			e := err.(*Error)
			bad[e.Object] = true
			rejected = addReason(rejected, e)
		}
		l.errs = nil
		removed := dropLabeled(&l.sites, bad) + dropLabeled(&l.peerings, bad) + dropLabeled(&l.pools, bad) +
			dropLabeled(&l.assigns, bad) + dropLabeled(&l.nodes, bad)
		if removed == 0 {
			break // cannot happen: every rule reports against an object it checks
		}
	}
	set := l.build()
	set.Rejected = rejected
	return set, warnings
}

// addReason files e under its object, in the order objects were first seen.
func addReason(rs []Rejected, e *Error) []Rejected {
	for i := range rs {
		if rs[i].Object == e.Object && rs[i].File == e.File {
			rs[i].Reasons = append(rs[i].Reasons, e)
			return rs
		}
	}
	return append(rs, Rejected{File: e.File, Object: e.Object, Reasons: []*Error{e}})
}

// dropDuplicates keeps the first entry of each name and sets the others aside.
func dropDuplicates[T any](entries *[]entry[T]) []Rejected {
	var out []Rejected
	firstFile := make(map[string]string, len(*entries)) // name -> file of its first entry
	*entries = slices.DeleteFunc(*entries, func(e entry[T]) bool {
		file, ok := firstFile[e.label]
		if !ok {
			firstFile[e.label] = e.file
			return false
		}
		msg := "duplicate name: set aside, the first stays"
		if file != "" {
			msg = fmt.Sprintf("duplicate name, first defined in %s: set aside", file)
		}
		out = append(out, Rejected{File: e.file, Object: e.label,
			Reasons: []*Error{{File: e.file, Object: e.label, Field: "metadata.name", Msg: msg}}})
		return true
	})
	return out
}

func dropLabeled[T any](entries *[]entry[T], bad map[string]bool) int {
	n := len(*entries)
	*entries = slices.DeleteFunc(*entries, func(e entry[T]) bool { return bad[e.label] })
	return n - len(*entries)
}
