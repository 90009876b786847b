package plan

import "github.com/isthmus-dev/isthmus/loader/objects"

// SetAside is an object that validation set aside, as `isthmus plan` reports
// it: the agent plans without it, exactly as the plan does.
type SetAside struct {
	// Object is the kind and name, such as `Node "cp-1"`, or where in its
	// file an object without a name starts.
	Object string `json:"object"`
	// File is the base name of the file the object came from; empty for an
	// object from the API.
	File string `json:"file,omitempty"`
	// Reasons are every rule the object broke: the field and what is wrong
	// with it, such as `status.addresses: InternalIP 172.31.0.10 is in no
	// Site's spec.nodeCidrs`.
	Reasons []string `json:"reasons"`
}

// SetAsideOf returns rs (a Set's Rejected) as plan reports them, in order.
func SetAsideOf(rs []objects.Rejected) []SetAside {
	out := make([]SetAside, 0, len(rs))
	for _, r := range rs {
		s := SetAside{Object: r.Object, File: r.File, Reasons: make([]string, len(r.Reasons))}
		for i, e := range r.Reasons {
			s.Reasons[i] = e.Msg
			if e.Field != "" {
				s.Reasons[i] = e.Field + ": " + e.Msg
			}
		}
		out = append(out, s)
	}
	return out
}
